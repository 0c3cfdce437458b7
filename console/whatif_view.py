"""How the what-if page shows a comparison (changed settings, headline metrics with their
deltas, the delta table, the twin's figures side by side) and the last applied prediction
against what the cluster measured since (GET /v1/audit, then GET /v1/report)."""

import time
from collections.abc import Mapping
from typing import Any

import streamlit as st

from backend.observe.measures import FIDELITY_METRICS, relative_error
from backend.policy.config import number_from_json
from console import format as fmt
from console import prediction as predictions
from console.connection import BackendError, client, show_error
from console.widgets import chart, table
from twin.compare import LOWER_IS_BETTER, compare_figures

HEADLINE_LABELS = {
    "ttft_p90_s": "TTFT p90",
    "tbt_p90_s": "TBT p90",
    "slo_attainment": "SLO attainment",
    "goodput_rps": "Goodput",
    "num_rejected": "Rejected",
}
_FIGURE_HEIGHT_PX = 360
AUDIT_LOOKBACK = 100


def show_result(whatif: Mapping[str, Any]) -> None:
    result = whatif["result"]
    trace = whatif["trace"]
    reports = result["reports"]
    st.subheader("Current vs proposed")
    source = trace.get("name") or (
        f"recorded {fmt.clock(trace.get('start_s'))} to {fmt.clock(trace.get('end_s'))}"
    )
    changes = [
        f"{name}: {fmt.number(values['baseline'])} → {fmt.number(values['candidate'])}"
        if not isinstance(values["baseline"], str)
        else f"{name}: {values['baseline']} → {values['candidate']}"
        for name, values in result["changed_settings"].items()
    ]
    believes = trace.get("believes")
    st.caption(
        f"{fmt.count(trace['num_rows'])} requests ({source}); "
        f"changed: {'; '.join(changes) if changes else 'nothing'}"
        + (f"; the twin's Conductor believed {believes}" if believes else "")
    )
    candidate = reports["candidate"]
    deltas = {row["metric"]: row for row in result["deltas"]}
    for column, (name, label) in zip(
        st.columns(len(HEADLINE_LABELS)), HEADLINE_LABELS.items(), strict=True
    ):
        delta, relative = deltas[name]["delta"], deltas[name]["relative"]
        # No change (0, or under 0.1 %) or undefined (None): no arrow, no color.
        is_change = bool(delta) and (relative is None or abs(relative) >= 0.001)
        better_when_lower = name in LOWER_IS_BETTER
        color = ("inverse" if better_when_lower else "normal") if is_change else "off"
        column.metric(
            f"{label} (proposed)",
            fmt.metric(name, candidate.get(name)),
            delta=fmt.metric(name, delta) if delta is not None else None,
            delta_color=color,
            delta_arrow="auto" if is_change else "off",
            help=f"current: {fmt.metric(name, reports['baseline'].get(name))}",
        )
    table(
        [
            {
                "metric": row["metric"],
                "current": fmt.metric(row["metric"], row["baseline"]),
                "proposed": fmt.metric(row["metric"], row["candidate"]),
                "delta": fmt.metric(row["metric"], row["delta"]),
                "relative": fmt.ratio(row["relative"]),
                "verdict": row["verdict"] or "",
            }
            for row in result["deltas"]
        ],
        ["metric", "current", "proposed", "delta", "relative", "verdict"],
    )
    figures = compare_figures(
        {**result, "reports": {"current": reports["baseline"], "proposed": candidate}}
    )
    for figure in figures.values():
        figure.update_layout(height=_FIGURE_HEIGHT_PX, margin={"l": 50, "r": 20, "t": 50, "b": 40})
    left, right = st.columns(2)
    with left:
        chart(figures["ttft_cdf"], "whatif-ttft")
    with right:
        chart(figures["loads"], "whatif-loads")
    chart(figures["rejections"], "whatif-rejections")
    if trace.get("start_s") is not None and trace.get("end_s") is not None:
        show_trust(reports["baseline"], trace["start_s"], trace["end_s"])


def show_trust(current: Mapping[str, Any], start_s: float, end_s: float) -> None:
    """The twin's run of the current configuration beside what the cluster measured on the
    same recorded window (GET /v1/report), metric by metric: how far to trust the twin."""
    st.subheader("How far to trust the twin")
    try:
        measured = client().report(start_s=start_s, end_s=end_s)
    except BackendError as error:
        show_error(error, "cannot read what the cluster measured on this window")
        return
    rows = [
        {
            "metric": name,
            "live (measured)": fmt.metric(name, measured.get(name)),
            "twin (current config)": fmt.metric(name, current.get(name)),
            "error": fmt.ratio(relative_error(measured.get(name), current.get(name))),
        }
        for name in FIDELITY_METRICS
    ]
    st.caption(
        "The twin replayed this window on the current configuration; the errors are "
        "(twin - live) / live, by the definitions both share. `kvcentric twin validate` "
        "measures them over whole configurations (docs/fidelity.md)."
    )
    table(rows, ["metric", "live (measured)", "twin (current config)", "error"])


def show_applied_prediction() -> None:
    """The newest audited prediction made here, against the live report since it."""
    st.subheader("Predicted vs actual")
    backend = client()
    try:
        entries = backend.audit(limit=AUDIT_LOOKBACK)
    except BackendError as error:
        show_error(error, "cannot read the audit log")
        return
    entry = next((e for e in entries if predictions.is_console_prediction(e["prediction"])), None)
    if entry is None:
        st.caption("No change has been applied from a what-if yet.")
        return
    since_s = float(entry["time_s"])
    try:
        actual = backend.report(start_s=since_s, end_s=max(time.time(), since_s + 1.0))
    except BackendError as error:
        show_error(error, "cannot read what the cluster measured since the change")
        return
    prediction = entry["prediction"]
    st.caption(
        f"Change of {fmt.clock(since_s)} by {entry['actor']} (configuration version "
        f"{entry['config_version']}): the twin's proposed run on "
        f"{fmt.count(prediction['trace'].get('num_rows'))} requests against the "
        f"{fmt.count(actual['num_requests'])} requests the cluster has served since. "
        "Counts scale with the traffic; compare ratios, rates and latencies."
    )
    table(
        [
            {
                "metric": row["metric"],
                "predicted": fmt.metric(row["metric"], _number(row["predicted"])),
                "actual": fmt.metric(row["metric"], row["actual"]),
                "difference": fmt.metric(row["metric"], row["difference"]),
                "scales with traffic": "yes" if row["scales_with_traffic"] else "",
            }
            for row in predictions.predicted_vs_actual(prediction, actual)
        ],
        ["metric", "predicted", "actual", "difference", "scales with traffic"],
    )


def _number(value: Any) -> Any:
    """A value the prediction stored as a string because JSON has no infinity."""
    return number_from_json(value)
