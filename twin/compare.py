"""What-if comparison: a baseline and a candidate config on the same arrivals, deltas and plots.

The console calls `compare` directly, so its inputs and outputs are plain: two TwinConfigs
and the trace rows in, a JSON-ready dict out (the changed settings, one delta row per
metric with the direction that counts as better, and both reports).
"""

import json
from collections.abc import Sequence
from pathlib import Path

import plotly.graph_objects as go

from backend.traces.loader import TraceRow
from twin.cluster import LiveCalibration
from twin.config import TwinConfig
from twin.plots import load_figure, rejections_figure, ttft_cdf_figure, write_page
from twin.report import write_report
from twin.sweep import OnDone, run_sweep

FORMAT = "kvcentric-twin-compare/1"
LOWER_IS_BETTER = (
    "ttft_mean_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "tbt_p50_s",
    "tbt_p90_s",
    "tbt_p99_s",
    "num_rejected",
    "num_rejected_admission",
    "num_rejected_decode",
    "num_failed",
    "wasted_prefill_tokens",
    "wasted_prefill_s",
    "prefill_load_amplitude",
    "decode_load_amplitude",
)
HIGHER_IS_BETTER = (
    "num_completed",
    "slo_attainment",
    "goodput_rps",
    "cache_hit_ratio",
    "block_hit_ratio",
    "reachable_hit_ratio",
)
# Shown for context; neither direction is better in itself.
NEUTRAL = (
    "num_requests",
    "num_transferred_tokens",
    "num_replicated_blocks",
    "prefill_load_period_s",
    "decode_load_period_s",
    "sim_duration_s",
)
ROLES = ("baseline", "candidate")


def compare(
    baseline: TwinConfig,
    candidate: TwinConfig,
    rows: Sequence[TraceRow],
    *,
    workers: int = 2,
    trace_label: str = "",
    on_done: OnDone | None = None,
    ray_address: str | None = None,
    live_calibrations: tuple[LiveCalibration | None, LiveCalibration | None] | None = None,
) -> dict:
    """Simulate both configs on `rows` (in two processes when workers > 1, or as Ray tasks
    with `ray_address`) and compare them; `live_calibrations`, (baseline's, candidate's),
    as `run_sweep`'s."""
    reports = run_sweep(
        [baseline, candidate],
        rows,
        workers=workers,
        on_done=on_done,
        trace_label=trace_label,
        ray_address=ray_address,
        live_calibrations=live_calibrations,
    )
    return compare_reports(*reports)


def compare_reports(baseline: dict, candidate: dict) -> dict:
    """The comparison of two finished reports: changed settings, metric deltas, both reports."""
    base_config, cand_config = baseline["config"], candidate["config"]
    changed = {
        name: {"baseline": base_config[name], "candidate": cand_config.get(name)}
        for name in base_config
        if base_config[name] != cand_config.get(name)
    }
    return {
        "format": FORMAT,
        "trace": baseline["trace"],
        "changed_settings": changed,
        "deltas": metric_deltas(baseline, candidate),
        "reports": {"baseline": baseline, "candidate": candidate},
    }


def metric_deltas(baseline: dict, candidate: dict) -> list[dict]:
    """One row per metric: both values, candidate - baseline, relative change and verdict.

    `relative` is the delta over |baseline| (None when the baseline is 0 or undefined);
    `verdict` is "better", "worse" or "same" along `better` ("lower" or "higher"), and None
    for neutral metrics or when either value is undefined.
    """
    rows = []
    for metric, better in _directions():
        base, cand = baseline.get(metric), candidate.get(metric)
        delta = cand - base if base is not None and cand is not None else None
        rows.append(
            {
                "metric": metric,
                "baseline": base,
                "candidate": cand,
                "delta": delta,
                "relative": delta / abs(base) if delta is not None and base else None,
                "better": better,
                "verdict": _verdict(delta, better),
            }
        )
    return rows


def compare_figures(result: dict) -> dict[str, go.Figure]:
    """TTFT CDFs, pool loads and rejections over time of both runs, side by side."""
    reports = result["reports"]
    return {
        "ttft_cdf": ttft_cdf_figure(reports),
        "loads": load_figure(reports),
        "rejections": rejections_figure(reports),
    }


def write_compare(result: dict, out_dir: Path) -> list[Path]:
    """Write compare.json (without the per-request reports), both reports and compare.html."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {key: value for key, value in result.items() if key != "reports"}
    paths = [out_dir / "compare.json"]
    paths[0].write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    for role in ROLES:
        paths.append(out_dir / f"{role}-report.json")
        write_report(result["reports"][role], paths[-1])
    paths.append(write_page(compare_figures(result), out_dir / "compare.html", "twin compare"))
    return paths


def _directions() -> list[tuple[str, str | None]]:
    return [
        *((metric, "lower") for metric in LOWER_IS_BETTER),
        *((metric, "higher") for metric in HIGHER_IS_BETTER),
        *((metric, None) for metric in NEUTRAL),
    ]


def _verdict(delta: float | None, better: str | None) -> str | None:
    if delta is None or better is None:
        return None
    if delta == 0:
        return "same"
    return "better" if (delta < 0) == (better == "lower") else "worse"
