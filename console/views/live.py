"""Live page: the pools' load over time with its oscillation, admissions and rejections by
stage and reason, TTFT and TBT percentiles against the SLOs, goodput and wasted prefill of
the chosen window (GET /v1/report), refreshed in place every few seconds."""

import time

import streamlit as st

from console import charts
from console import format as fmt
from console.connection import BackendError, client, show_error
from console.widgets import chart, metric_row, refreshed_window_panel, table

HELP = {
    "goodput_rps": "Requests per second completed within both the TTFT and the TBT SLO.",
    "slo_attainment": "Share of finished requests that met both SLOs.",
    "num_cancelled": "Requests whose client went away (or that passed the request deadline) "
    "before they finished: their agents dropped them.",
    "wasted_prefill_tokens": "Prefill tokens computed for requests then rejected at decode.",
    "prefill_load_amplitude": "Peak-to-trough (p95 - p5) of the prefill pool's load.",
    "prefill_load_period_s": "First autocorrelation peak of the load; n/a when no clear rhythm.",
}


def live_panel(window_s: float) -> None:
    try:
        report = client().report(window_s=window_s)
    except BackendError as error:
        show_error(error, "cannot read the live report")
        return
    st.caption(
        f"{fmt.clock(report['start_s'])} to {fmt.clock(report['end_s'])}; "
        f"series every {fmt.seconds(report['series']['interval_s'])}; "
        f"updated {time.strftime('%H:%M:%S', time.gmtime())} UTC"
    )
    if not report["num_requests"]:
        st.info("No requests arrived in this window.")
    metric_row(
        report,
        [
            ("Requests", "num_requests"),
            ("Completed", "num_completed"),
            ("Rejected", "num_rejected"),
            ("Failed", "num_failed"),
            ("Cancelled", "num_cancelled"),
        ],
        HELP,
    )
    metric_row(
        report,
        [
            ("Goodput", "goodput_rps"),
            ("SLO attainment", "slo_attainment"),
            ("Wasted prefill tokens", "wasted_prefill_tokens"),
            ("Wasted prefill time", "wasted_prefill_s"),
        ],
        HELP,
    )
    metric_row(
        report,
        [
            ("Prefill load amplitude", "prefill_load_amplitude"),
            ("Prefill load period", "prefill_load_period_s"),
            ("Decode load amplitude", "decode_load_amplitude"),
            ("Decode load period", "decode_load_period_s"),
        ],
        HELP,
    )
    chart(charts.live_load_figure(report), "live-load")
    left, right = st.columns([3, 2])
    with left:
        chart(charts.admissions_figure(report), "live-admissions")
    with right:
        st.markdown("**Rejections by stage and reason**")
        rows = [
            {"stage": key.partition(":")[0], "reason": key.partition(":")[2], "requests": count}
            for key, count in report["rejected_by_reason"].items()
        ]
        table(rows, ["stage", "reason", "requests"])
        st.caption(
            f"{fmt.count(report['num_rejected_admission'])} at admission (early, HTTP 429), "
            f"{fmt.count(report['num_rejected_decode'])} at decode (late, prefill wasted)"
        )
    metric_row(
        report,
        [
            ("TTFT p50", "ttft_p50_s"),
            ("TTFT p90", "ttft_p90_s"),
            ("TTFT p99", "ttft_p99_s"),
            ("TBT p50", "tbt_p50_s"),
            ("TBT p90", "tbt_p90_s"),
            ("TBT p99", "tbt_p99_s"),
        ],
    )
    left, right = st.columns(2)
    with left:
        figure = charts.latency_figure(report, "ttft", report.get("ttft_slo_s"), "TTFT vs SLO")
        chart(figure, "live-ttft")
    with right:
        figure = charts.latency_figure(report, "tbt", report.get("tbt_slo_s"), "TBT vs SLO")
        chart(figure, "live-tbt")


st.title("Live")
refreshed_window_panel(live_panel, key="live_refresh")
