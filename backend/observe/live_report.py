"""The live report: the shared metrics of one recorded time window, in the twin's names.

Built from what the Conductor records (requests with their outcomes, decisions, load
samples), it has the same top-level keys and series as the twin's report (twin/report.py),
so a what-if prediction and what the cluster then measured compare key by key. Where the
live system measures less than the twin sees, the definition says how it is approximated:

- TBT percentiles are over every inter-token gap of every completed request, from each
  request's log-binned gap histogram (`measures.histogram_percentile`, as the twin's);
- wasted prefill seconds are the predicted prefill time of late-rejected requests;
- the reachable hit ratio is the longest prefix any prefill instance held at decision time;
- every fetch is a replication (the fetched blocks stay on the fetching instance), so
  replicated blocks are the fetched blocks.
"""

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from backend.db.records import DecisionRecord, LoadSample, RequestRecord
from backend.observe.measures import (
    gap_histogram,
    histogram_percentile,
    merge_histograms,
    oscillation,
    percentile,
    window_means,
)
from backend.policy.config import PolicyConfig

DEFAULT_NUM_WINDOWS = 60


def _gaps_of(request: RequestRecord) -> dict[int, float]:
    """A completed request's gap histogram; a row recorded before histograms were kept
    stands for its gaps by its mean gap."""
    outcome = request.outcome
    assert outcome is not None
    if outcome.tbt_gap_histogram is not None:
        return outcome.tbt_gap_histogram
    num_gaps = max(0, (outcome.num_generated_tokens or 0) - 1)
    if outcome.tbt_mean_s is None or not num_gaps:
        return {}
    return gap_histogram([outcome.tbt_mean_s], [num_gaps])


def default_interval_s(span_s: float) -> float:
    """A series interval giving about DEFAULT_NUM_WINDOWS windows, at least one second."""
    return max(1.0, math.ceil(span_s / DEFAULT_NUM_WINDOWS))


def build_live_report(
    config: PolicyConfig,
    requests: Sequence[RequestRecord],
    decisions: Sequence[DecisionRecord],
    samples: Sequence[LoadSample],
    *,
    start_s: float,
    end_s: float,
    interval_s: float,
) -> dict[str, Any]:
    """The report of requests that arrived in [start_s, end_s) and samples taken in it."""
    block_size = config.block_size
    latest = _latest_decisions(decisions)
    finished = [r for r in requests if r.outcome is not None]
    completed = [r for r in finished if r.outcome.state == "completed"]  # type: ignore[union-attr]
    rejected = [r for r in finished if r.outcome.state == "rejected"]  # type: ignore[union-attr]
    late = [r for r in rejected if r.outcome.stage == "decode"]  # type: ignore[union-attr]
    dispatched = [r for r in requests if r.request_id in latest]
    ttfts = [r.outcome.ttft_s for r in completed if r.outcome.ttft_s is not None]  # type: ignore[union-attr]
    gaps = merge_histograms(_gaps_of(r) for r in completed)
    good = [r for r in completed if _within_slos(r, config)]
    # Goodput per second of the arrival span, as the twin defines it (not of the window).
    arrivals = [r.arrival_time_s for r in requests]
    span_s = max(1.0, (max(arrivals) - min(arrivals)) if arrivals else 0.0)
    input_tokens = sum(r.num_input_tokens for r in dispatched)
    full_blocks = sum(r.num_input_tokens // block_size for r in dispatched)
    reused = {rid: d.num_reused_tokens for rid, d in latest.items()}
    reachable = {
        rid: max((c.prefix_blocks for c in d.candidates), default=0) * block_size
        for rid, d in latest.items()
    }
    series = _series(config, requests, decisions, samples, start_s, end_s, interval_s)
    prefill_amplitude, prefill_period = oscillation(series["prefill_load"], interval_s)
    decode_amplitude, decode_period = oscillation(series["decode_load"], interval_s)
    return {
        "start_s": start_s,
        "end_s": end_s,
        "ttft_slo_s": config.ttft_slo_s,
        "tbt_slo_s": config.tbt_slo_s,
        "num_requests": len(requests),
        "num_in_flight": len(requests) - len(finished),
        "num_completed": len(completed),
        "num_rejected": len(rejected),
        "num_rejected_admission": sum(r.outcome.stage == "admission" for r in rejected),  # type: ignore[union-attr]
        "num_rejected_decode": len(late),
        "num_failed": sum(r.outcome.state == "failed" for r in finished),  # type: ignore[union-attr]
        "num_cancelled": sum(r.outcome.state == "cancelled" for r in finished),  # type: ignore[union-attr]
        "cancelled_by_reason": _by_reason(finished, "cancelled"),
        "rejected_by_reason": dict(sorted(Counter(_reason(r) for r in rejected).items())),
        "failed_by_reason": _by_reason(finished, "failed"),
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p90_s": percentile(ttfts, 90),
        "ttft_p99_s": percentile(ttfts, 99),
        "ttft_mean_s": float(np.mean(ttfts)) if ttfts else None,
        "tbt_p50_s": histogram_percentile(gaps, 50),
        "tbt_p90_s": histogram_percentile(gaps, 90),
        "tbt_p99_s": histogram_percentile(gaps, 99),
        "slo_attainment": len(good) / len(finished) if finished else None,
        "goodput_rps": len(good) / span_s,
        "cache_hit_ratio": sum(reused.values()) / input_tokens if input_tokens else None,
        "block_hit_ratio": sum(t // block_size for t in reused.values()) / full_blocks
        if full_blocks
        else None,
        "reachable_hit_ratio": sum(reachable.values()) / input_tokens if input_tokens else None,
        "wasted_prefill_tokens": sum(
            latest[r.request_id].num_compute_tokens for r in late if r.request_id in latest
        ),
        "wasted_prefill_s": sum(
            latest[r.request_id].estimated_prefill_s for r in late if r.request_id in latest
        ),
        "prefill_load_amplitude": prefill_amplitude,
        "prefill_load_period_s": prefill_period,
        "decode_load_amplitude": decode_amplitude,
        "decode_load_period_s": decode_period,
        "num_transferred_tokens": sum(d.num_fetch_blocks for d in decisions) * block_size,
        "num_replicated_blocks": sum(d.num_fetch_blocks for d in decisions),
        "num_output_tokens": sum(r.outcome.num_generated_tokens or 0 for r in completed),  # type: ignore[union-attr]
        "series": series,
    }


def _latest_decisions(decisions: Sequence[DecisionRecord]) -> dict[str, DecisionRecord]:
    """Each request's last decision (a re-routed request has several)."""
    latest: dict[str, DecisionRecord] = {}
    for decision in decisions:
        latest[decision.request_id] = decision
    return latest


def _within_slos(record: RequestRecord, config: PolicyConfig) -> bool:
    outcome = record.outcome
    assert outcome is not None
    ttft_slo_s = record.ttft_slo_s or config.ttft_slo_s
    tbt_slo_s = record.tbt_slo_s or config.tbt_slo_s
    return (
        outcome.ttft_s is not None
        and outcome.ttft_s <= ttft_slo_s
        and (outcome.tbt_mean_s or 0.0) <= tbt_slo_s
    )


def _by_reason(finished: Sequence[RequestRecord], state: str) -> dict[str, int]:
    """How many finished requests ended in `state`, by reason, sorted by reason."""
    reasons = Counter(
        r.outcome.reason or "unknown"  # type: ignore[union-attr]
        for r in finished
        if r.outcome.state == state  # type: ignore[union-attr]
    )
    return dict(sorted(reasons.items()))


def _reason(record: RequestRecord) -> str:
    outcome = record.outcome
    assert outcome is not None
    return f"{outcome.stage or 'unknown'}:{outcome.reason or 'unknown'}"


def _series(
    config: PolicyConfig,
    requests: Sequence[RequestRecord],
    decisions: Sequence[DecisionRecord],
    samples: Sequence[LoadSample],
    start_s: float,
    end_s: float,
    interval_s: float,
) -> dict[str, Any]:
    num_windows = max(1, math.ceil((end_s - start_s) / interval_s))
    edges = np.arange(num_windows + 1) * interval_s
    edges[-1] = max(edges[-1], end_s - start_s) + 1e-9

    def window_of(time_s: float) -> int:
        return min(num_windows - 1, max(0, int((time_s - start_s) // interval_s)))

    def counts(times: Sequence[float], weights: Sequence[int] | None = None) -> list[int]:
        totals = [0] * num_windows
        for i, time_s in enumerate(times):
            totals[window_of(time_s)] += 1 if weights is None else weights[i]
        return totals

    pools = _pool_loads(samples, config.ttft_slo_s, start_s)
    outcomes = [r.outcome for r in requests if r.outcome is not None]
    rejected: dict[str, list[float]] = defaultdict(list)
    for r in requests:
        if r.outcome is not None and r.outcome.state == "rejected":
            rejected[_reason(r)].append(r.outcome.finished_time_s)
    ttft_by_window: list[list[float]] = [[] for _ in range(num_windows)]
    tbt_by_window: list[list[float]] = [[] for _ in range(num_windows)]
    for r in requests:
        o = r.outcome
        if o is not None and o.state == "completed" and o.ttft_s is not None:
            ttft_by_window[window_of(r.arrival_time_s)].append(o.ttft_s)
            if o.tbt_mean_s is not None:
                tbt_by_window[window_of(r.arrival_time_s)].append(o.tbt_mean_s)
    admitted_ids = {d.request_id for d in decisions}
    return {
        "interval_s": interval_s,
        "t_s": [float(t) for t in edges[:num_windows]],
        "prefill_load": window_means(pools["t_s"], pools["prefill"], edges) if pools else [],
        "decode_load": window_means(pools["t_s"], pools["decode"], edges) if pools else [],
        "admitted": counts([r.arrival_time_s for r in requests if r.request_id in admitted_ids]),
        "completed": counts([o.finished_time_s for o in outcomes if o.state == "completed"]),
        "rejected": {reason: counts(times) for reason, times in sorted(rejected.items())},
        "ttft_p50_s": [percentile(w, 50) for w in ttft_by_window],
        "ttft_p90_s": [percentile(w, 90) for w in ttft_by_window],
        "tbt_p50_s": [percentile(w, 50) for w in tbt_by_window],
        "tbt_p90_s": [percentile(w, 90) for w in tbt_by_window],
        "transferred_tokens": counts(
            [d.decided_time_s for d in decisions],
            [d.num_fetch_blocks * config.block_size for d in decisions],
        ),
        "replicated_blocks": counts(
            [d.decided_time_s for d in decisions], [d.num_fetch_blocks for d in decisions]
        ),
    }


def _pool_loads(
    samples: Sequence[LoadSample], ttft_slo_s: float, start_s: float
) -> dict[str, list[float]]:
    """Per sampling moment (seconds since start_s), the mean load of each pool, as the twin
    samples it: prefill as T_queue over the TTFT SLO, decode as the policy's decode load."""
    by_time: dict[float, tuple[list[float], list[float]]] = {}
    for sample in samples:
        prefill, decode = by_time.setdefault(sample.time_s, ([], []))
        if sample.prefill_load_s is not None:
            prefill.append(sample.prefill_load_s / ttft_slo_s)
        if sample.decode_load is not None:
            decode.append(sample.decode_load)
    if not by_time:
        return {}
    times = sorted(by_time)
    return {
        "t_s": [t - start_s for t in times],
        "prefill": [float(np.mean(by_time[t][0])) if by_time[t][0] else 0.0 for t in times],
        "decode": [float(np.mean(by_time[t][1])) if by_time[t][1] else 0.0 for t in times],
    }
