"""Plotly figures of the live cluster: pool loads, admissions and rejections, latency
percentiles against the SLOs, cache hot spots, pool occupancy, transfers.

Inputs are the backend's JSON as it comes (GET /v1/report, GET /v1/cache). The live report
has the twin report's names, so the twin's own figure builders (twin/plots.py) draw its
loads and rejections; only the x axis changes, to wall-clock time.
"""

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from console import format as fmt
from twin.plots import count_ticks, load_figure, rejections_figure

_COLORS = qualitative.Plotly
_HEIGHT_PX = 340
_MARGIN = {"l": 50, "r": 20, "t": 50, "b": 40}


def wall_times(report: Mapping[str, Any]) -> list[datetime]:
    """The series' window starts as UTC datetimes (the series counts seconds from start_s)."""
    start_s = float(report["start_s"])
    return [datetime.fromtimestamp(start_s + t, UTC) for t in report["series"]["t_s"]]


def live_load_figure(report: Mapping[str, Any]) -> go.Figure:
    """Prefill and decode pool load on one chart, titled with their oscillation."""
    title = (
        f"Pool load: prefill amplitude {fmt.load(report.get('prefill_load_amplitude'))}, "
        f"period {fmt.seconds(report.get('prefill_load_period_s'))}; decode amplitude "
        f"{fmt.load(report.get('decode_load_amplitude'))}, "
        f"period {fmt.seconds(report.get('decode_load_period_s'))}"
    )
    figure = load_figure({"live": _on_wall_clock(report)}, title=title)
    figure.update_xaxes(title_text=None)  # the twin's "simulated time"; these are UTC times
    return _styled(figure)


def admissions_figure(report: Mapping[str, Any]) -> go.Figure:
    """Rejections per window stacked by stage:reason, with admissions and completions."""
    live = _on_wall_clock(report)
    figure = rejections_figure({"live": live})
    series = live["series"]
    for index, (name, key) in enumerate((("admitted", "admitted"), ("completed", "completed"))):
        figure.add_scatter(
            x=series["t_s"],
            y=series.get(key, []),
            name=name,
            mode="lines+markers",
            line={"color": _COLORS[(index + 7) % len(_COLORS)]},
            row=1,
            col=1,
        )
    figure.update_layout(title="Admissions, completions and rejections (stage:reason)")
    figure.layout.annotations = ()  # the twin's per-run subplot title; one run here
    figure.update_yaxes(title_text="requests per window")
    figure.update_xaxes(title_text=None)
    return _styled(figure)


def latency_figure(
    report: Mapping[str, Any], metric: str, slo_s: float | None, title: str
) -> go.Figure:
    """The p50 and p90 of `metric` ("ttft" or "tbt") per window, with its SLO as a line."""
    series = report["series"]
    times = wall_times(report)
    figure = go.Figure()
    for index, quantile in enumerate(("p50", "p90")):
        values = series.get(f"{metric}_{quantile}_s", [])
        figure.add_scatter(
            x=times,
            y=values,
            name=f"{metric.upper()} {quantile}",
            mode="lines+markers",
            connectgaps=False,
            line={"color": _COLORS[index]},
        )
    if slo_s is not None:
        figure.add_hline(
            y=slo_s, line_dash="dot", line_color="red", annotation_text=f"SLO {fmt.seconds(slo_s)}"
        )
    figure.update_layout(title=title, yaxis_title="seconds")
    return _styled(figure)


def transfers_figure(report: Mapping[str, Any]) -> go.Figure:
    """KV tokens transferred (bars) and blocks replicated (line) per window."""
    series = report["series"]
    times = wall_times(report)
    figure = make_subplots(specs=[[{"secondary_y": True}]])
    figure.add_bar(
        x=times,
        y=series.get("transferred_tokens", [0] * len(times)),
        name="transferred tokens",
        marker_color=_COLORS[0],
        secondary_y=False,
    )
    figure.add_scatter(
        x=times,
        y=series.get("replicated_blocks", [0] * len(times)),
        name="replicated blocks",
        mode="lines+markers",
        line={"color": _COLORS[1]},
        secondary_y=True,
    )
    figure.update_layout(title="KV transfers and hot-spot replications")
    tokens = series.get("transferred_tokens") or [0]
    blocks = series.get("replicated_blocks") or [0]
    figure.update_yaxes(title_text="tokens", secondary_y=False, **count_ticks(max(tokens)))
    figure.update_yaxes(title_text="blocks", secondary_y=True, **count_ticks(max(blocks)))
    figure.update_yaxes(rangemode="tozero")  # both axes: their zeros line up
    return _styled(figure)


def hit_ratio_figure(report: Mapping[str, Any]) -> go.Figure:
    """Achieved hit ratios (token and block weighted) against the reachable one."""
    names = ("cache_hit_ratio", "block_hit_ratio", "reachable_hit_ratio")
    labels = ("achieved (tokens)", "achieved (blocks)", "reachable")
    values = [report.get(name) for name in names]
    figure = go.Figure(
        go.Bar(
            x=list(labels),
            y=[value or 0.0 for value in values],
            text=[fmt.ratio(value) for value in values],
            textposition="outside",
            marker_color=[_COLORS[0], _COLORS[0], _COLORS[2]],
        )
    )
    figure.update_layout(title="Cache hit ratio: achieved vs reachable", yaxis_range=[0, 1.05])
    figure.update_yaxes(tickformat=".0%")
    return _styled(figure)


def hot_blocks_figure(hot_blocks: Sequence[Mapping[str, Any]]) -> go.Figure:
    """Hits of the hottest blocks, colored by how many shards hold a replica."""
    labels = [f"{block['key'][:10]}… (depth {block['depth']})" for block in hot_blocks]
    figure = go.Figure(
        go.Bar(
            x=[block["hits"] for block in hot_blocks],
            y=labels,
            orientation="h",
            marker={
                "color": [block["num_replicas"] for block in hot_blocks],
                "colorscale": "Viridis",
                # Replicas are counts: whole-number ticks on the color bar too.
                "colorbar": {"title": "replicas", "tick0": 0, "dtick": 1},
            },
            hovertext=[holders_text(block["holders"]) for block in hot_blocks],
        )
    )
    figure.update_layout(title="Hottest blocks (hits)", xaxis_title="hits")
    # Every block labelled (plotly drops every other label of a crowded axis).
    figure.update_yaxes(autorange="reversed", tickmode="array", tickvals=labels)
    figure = _styled(figure)
    figure.update_layout(height=max(300, 22 * len(labels) + 120))
    return figure


def occupancy_figure(instances: Sequence[Mapping[str, Any]]) -> go.Figure:
    """Each agent's pool use by tier, as a share of that tier's capacity."""
    names = [instance["instance_id"] for instance in instances]
    figure = go.Figure()
    for index, tier in enumerate(("dram", "ssd")):
        used = [instance[f"{tier}_bytes"] for instance in instances]
        capacity = [instance[f"{tier}_capacity_bytes"] for instance in instances]
        figure.add_bar(
            x=names,
            y=[u / c if c else 0.0 for u, c in zip(used, capacity, strict=True)],
            name=tier.upper(),
            text=[
                f"{fmt.data_size(u)} of {fmt.data_size(c)}"
                for u, c in zip(used, capacity, strict=True)
            ],
            marker_color=_COLORS[index],
        )
    figure.update_layout(title="Pool occupancy by tier", barmode="group")
    figure.update_yaxes(title_text="share of capacity", tickformat=".1%")
    return _styled(figure)


def holders_text(holders: Mapping[str, str]) -> str:
    """'prefill-0 (dram), prefill-1 (ssd)'; a block no shard holds any more was evicted."""
    if not holders:
        return "(evicted)"
    return ", ".join(f"{instance} ({tier})" for instance, tier in sorted(holders.items()))


def calibration_figure(calibration: Mapping[str, Any]) -> go.Figure:
    """Believed vs measured seconds of every prefill and decode step in the calibration
    window (GET /v1/calibration), on log axes; on the diagonal the model is exact."""
    figure = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=(
            f"Prefill ({_error_text(calibration.get('prefill_median_rel_err'))})",
            f"Decode step ({_error_text(calibration.get('decode_median_rel_err'))})",
        ),
    )
    for col, kind in ((1, "prefill"), (2, "decode")):
        points = calibration.get(kind) or []
        measured = [p["measured_s"] * 1000 for p in points]
        believed = [p["believed_s"] * 1000 for p in points]
        figure.add_trace(
            go.Scatter(
                x=measured,
                y=believed,
                mode="markers",
                marker={"size": 5, "color": _COLORS[col - 1], "opacity": 0.6},
                name=f"{kind}: believed vs measured",
            ),
            row=1,
            col=col,
        )
        if measured:
            low = max(min(min(measured), min(believed)), 1e-3)
            high = max(max(measured), max(believed))
            figure.add_trace(
                go.Scatter(
                    x=[low, high],
                    y=[low, high],
                    mode="lines",
                    line={"dash": "dot", "color": "gray"},
                    name="exact",
                    showlegend=col == 1,
                ),
                row=1,
                col=col,
            )
        figure.update_xaxes(title_text="measured (ms)", type="log", row=1, col=col)
        figure.update_yaxes(title_text="believed (ms)", type="log", row=1, col=col)
    return _styled(figure)


def _error_text(error: float | None) -> str:
    return "no points yet" if error is None else f"median error {error:.0%}"


def _on_wall_clock(report: Mapping[str, Any]) -> dict[str, Any]:
    """A shallow copy whose series' t_s are datetimes, for the twin's figure builders."""
    return {**report, "series": {**report["series"], "t_s": wall_times(report)}}


def _styled(figure: go.Figure) -> go.Figure:
    figure.update_layout(height=_HEIGHT_PX, margin=_MARGIN, legend={"orientation": "h", "y": -0.2})
    return figure
