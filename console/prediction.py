"""The prediction a what-if leaves behind: a compact, JSON-safe summary of a comparison (the
changed settings, the metric deltas and both runs' top-level metrics, never the per-request
rows) sent with an applied change and kept in the audit log; and its comparison, key by key,
with what the cluster measured after the change (the live report uses the twin's names)."""

from collections.abc import Mapping, Sequence
from typing import Any

from backend.policy import config as config_codec
from twin.compare import HIGHER_IS_BETTER, LOWER_IS_BETTER, NEUTRAL

FORMAT = "kvcentric-console-prediction/1"
# The report's top-level metrics a prediction keeps (the twin's run time is not one).
METRICS = (
    *LOWER_IS_BETTER,
    *HIGHER_IS_BETTER,
    *(name for name in NEUTRAL if name != "sim_duration_s"),
    "num_output_tokens",
    "ttft_slo_s",
    "tbt_slo_s",
)
# Metrics whose value scales with the traffic of the window rather than with the policy.
VOLUME_METRICS = frozenset(
    name for name in METRICS if name.startswith("num_") or name.endswith("_tokens")
) | {"wasted_prefill_s"}
# Shown first on the page and in the audit log.
HEADLINE = ("ttft_p90_s", "tbt_p90_s", "slo_attainment", "goodput_rps", "num_rejected")


def summarize(
    result: Mapping[str, Any],
    *,
    config_change: Mapping[str, Any],
    role_switches: Sequence[tuple[str, str]],
    trace: Mapping[str, Any],
    made_at_s: float,
) -> dict[str, Any]:
    """The prediction of a `twin.compare` result, ready for PUT /v1/config's `prediction`."""
    reports = result["reports"]
    split = {
        role: f"{reports[role]['config']['num_prefill']}:{reports[role]['config']['num_decode']}"
        for role in ("baseline", "candidate")
    }
    summary = {
        "format": FORMAT,
        "made_at_s": made_at_s,
        "trace": dict(trace),
        "profile": reports["baseline"]["config"].get("profile"),
        "changed_settings": result["changed_settings"],
        "config_change": dict(config_change),
        "role_switches": [{"instance_id": i, "role": role} for i, role in role_switches],
        "split": split,
        "deltas": [
            {key: row[key] for key in ("metric", "baseline", "candidate", "delta", "verdict")}
            for row in result["deltas"]
            if row["metric"] in METRICS
        ],
        "baseline": top_level_metrics(reports["baseline"]),
        "candidate": top_level_metrics(reports["candidate"]),
    }
    return json_safe(summary)


def top_level_metrics(report: Mapping[str, Any]) -> dict[str, Any]:
    metrics = {name: report.get(name) for name in METRICS if name in report}
    metrics["rejected_by_reason"] = dict(report.get("rejected_by_reason", {}))
    return metrics


def is_console_prediction(prediction: Mapping[str, Any] | None) -> bool:
    return bool(prediction) and prediction.get("format") == FORMAT  # type: ignore[union-attr]


def predicted_vs_actual(
    prediction: Mapping[str, Any], actual: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """One row per metric both carry: predicted (the candidate run), actual, difference."""
    predicted = prediction["candidate"]
    rows = []
    for name in METRICS:
        if name not in predicted or name not in actual:
            continue
        expected, measured = predicted[name], actual[name]
        difference = (
            measured - expected
            if isinstance(expected, int | float) and isinstance(measured, int | float)
            else None
        )
        rows.append(
            {
                "metric": name,
                "predicted": expected,
                "actual": measured,
                "difference": difference,
                "relative": difference / abs(expected)
                if difference is not None and expected
                else None,
                "scales_with_traffic": name in VOLUME_METRICS,
            }
        )
    return rows


json_safe = config_codec.json_safe  # the one codec of strict JSON
