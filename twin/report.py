"""The twin's report: the shared metrics, 10-second time series and per-request rows.

Names and definitions are the ones the live system reports, so the two can be put side by
side. The report is plain JSON-ready data; `write_report` writes it deterministically
(sorted keys, rounded floats), so the same seed gives the same bytes.
"""

import json
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from backend.observe.measures import (
    gap_histogram,
    histogram_percentile,
    oscillation,
    percentile,
    window_means,
)
from twin.config import TwinConfig
from twin.recorder import RequestRecord

REPORT_FORMAT = "kvcentric-twin-report/1"
_DIGITS = 6


def build_report(
    config: TwinConfig,
    records: Sequence[RequestRecord],
    *,
    load_t_s: Sequence[float],
    prefill_load: Sequence[float],
    decode_load: Sequence[float],
    tbt_steps_s: np.ndarray,
    tbt_tokens: np.ndarray,
    num_replicated_blocks: int,
    sim_duration_s: float,
    sim_wall_s: float | None,
    trace: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble the report of one run from what the recorder and the instances kept."""
    policy = config.policy_config()
    block_size = config.block_size
    completed = [r for r in records if r.outcome == "completed"]
    rejected = [r for r in records if r.outcome == "rejected"]
    dispatched = [r for r in records if r.prefill_instance is not None]
    ttfts = [r.ttft_s for r in completed if r.ttft_s is not None]
    good = [
        r
        for r in completed
        if r.ttft_s is not None
        and r.ttft_s <= policy.ttft_slo_s
        and (r.tbt_mean_s or 0.0) <= policy.tbt_slo_s
    ]
    late = [r for r in rejected if r.stage == "decode"]
    # Every decode step gives each request in the batch one gap of that step's length.
    tbt_gaps = gap_histogram(tbt_steps_s.tolist(), tbt_tokens.tolist())
    arrivals = [r.arrival_s for r in records]
    span_s = max(1.0, (max(arrivals) - min(arrivals)) if arrivals else 0.0)
    input_tokens = sum(r.input_tokens for r in dispatched)
    full_blocks = sum(r.input_tokens // block_size for r in dispatched)
    interval_s = config.series_interval_s
    series = _series(records, load_t_s, prefill_load, decode_load, sim_duration_s, interval_s)
    prefill_amplitude, prefill_period = oscillation(series["prefill_load"], interval_s)
    decode_amplitude, decode_period = oscillation(series["decode_load"], interval_s)

    report: dict[str, Any] = {
        "format": REPORT_FORMAT,
        "config": config.to_dict(),
        "trace": trace,
        "num_requests": len(records),
        "num_completed": len(completed),
        "num_rejected": len(rejected),
        "num_rejected_admission": sum(r.stage == "admission" for r in rejected),
        "num_rejected_decode": len(late),
        "num_failed": sum(r.outcome == "failed" for r in records),
        # The twin's clients never leave early and it models no request deadline, so this
        # stays 0; it is here so that a live report and the twin's read alike.
        "num_cancelled": sum(r.outcome == "cancelled" for r in records),
        "rejected_by_reason": dict(
            sorted(Counter(f"{r.stage}:{r.reason}" for r in rejected).items())
        ),
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p90_s": percentile(ttfts, 90),
        "ttft_p99_s": percentile(ttfts, 99),
        "ttft_mean_s": float(np.mean(ttfts)) if ttfts else None,
        "tbt_p50_s": histogram_percentile(tbt_gaps, 50),
        "tbt_p90_s": histogram_percentile(tbt_gaps, 90),
        "tbt_p99_s": histogram_percentile(tbt_gaps, 99),
        "slo_attainment": len(good) / len(records) if records else None,
        "goodput_rps": len(good) / span_s,
        "cache_hit_ratio": sum(r.reused_tokens for r in dispatched) / input_tokens
        if input_tokens
        else None,
        "block_hit_ratio": sum(r.reused_tokens // block_size for r in dispatched) / full_blocks
        if full_blocks
        else None,
        "reachable_hit_ratio": sum(r.reachable_tokens for r in dispatched) / input_tokens
        if input_tokens
        else None,
        "wasted_prefill_tokens": sum(r.computed_tokens for r in late),
        "wasted_prefill_s": sum(r.prefill_compute_s for r in late),
        "prefill_load_amplitude": prefill_amplitude,
        "prefill_load_period_s": prefill_period,
        "decode_load_amplitude": decode_amplitude,
        "decode_load_period_s": decode_period,
        "num_transferred_tokens": sum(r.transferred_tokens for r in dispatched),
        "num_replicated_blocks": num_replicated_blocks,
        "num_output_tokens": sum(r.output_tokens for r in completed),
        "sim_duration_s": sim_duration_s,
        "sim_wall_s": sim_wall_s,
        "series": series,
        "requests": [_row(r) for r in records],
    }
    if extra:
        report.update(extra)
    return report


def _series(records, load_t_s, prefill_load, decode_load, end_s: float, interval_s: float):
    num_windows = max(1, math.ceil(end_s / interval_s))
    edges = np.arange(num_windows + 1) * interval_s
    edges[-1] = max(edges[-1], end_s) + 1e-9

    def counts(times: list[float]) -> list[int]:
        index = np.searchsorted(edges, np.asarray(times, dtype=float), side="right") - 1
        return [int(c) for c in np.bincount(index, minlength=num_windows)[:num_windows]]

    rejected: dict[str, list[float]] = {}
    for r in records:
        if r.outcome == "rejected" and r.finish_s is not None:
            rejected.setdefault(f"{r.stage}:{r.reason}", []).append(r.finish_s)
    ttft_by_window: list[list[float]] = [[] for _ in range(num_windows)]
    for r in records:
        if r.outcome == "completed" and r.ttft_s is not None:
            ttft_by_window[min(num_windows - 1, int(r.arrival_s // interval_s))].append(r.ttft_s)
    return {
        "interval_s": interval_s,
        "t_s": [float(t) for t in edges[:num_windows]],
        "prefill_load": window_means(load_t_s, prefill_load, edges),
        "decode_load": window_means(load_t_s, decode_load, edges),
        "admitted": counts([r.arrival_s for r in records if r.prefill_instance is not None]),
        "completed": counts([r.finish_s for r in records if r.outcome == "completed"]),
        "rejected": {reason: counts(times) for reason, times in sorted(rejected.items())},
        "ttft_p50_s": [percentile(w, 50) for w in ttft_by_window],
        "ttft_p90_s": [percentile(w, 90) for w in ttft_by_window],
    }


def _row(r: RequestRecord) -> dict[str, Any]:
    return {
        "id": r.id,
        "arrival_s": r.arrival_s,
        "input_tokens": r.input_tokens,
        "output_tokens": r.output_tokens,
        "outcome": r.outcome,
        "reason": r.reason,
        "stage": r.stage,
        "prefill_instance": r.prefill_instance,
        "decode_instance": r.decode_instance,
        "ttft_s": r.ttft_s,
        "estimated_ttft_s": r.estimated_ttft_s,
        "tbt_mean_s": r.tbt_mean_s,
        "tbt_max_s": r.tbt_max_s,
        "reused_tokens": r.reused_tokens,
        "reachable_tokens": r.reachable_tokens,
        "transferred_tokens": r.transferred_tokens,
        "finish_s": r.finish_s,
    }


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        if math.isinf(value) or math.isnan(value):
            return str(value)
        return round(value, _DIGITS)
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(item) for item in value]
    return value


def dumps_report(report: dict[str, Any]) -> str:
    """Deterministic JSON text of a report."""
    return json.dumps(_rounded(report), sort_keys=True, separators=(",", ":")) + "\n"


def write_report(report: dict[str, Any], path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps_report(report))
