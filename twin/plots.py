"""Plotly figures of twin reports (TTFT CDFs, pool loads, rejections, sweeps) and their HTML page.

Each figure function takes plain report dicts (or a results table) and returns a go.Figure;
`write_page` puts several on one HTML page that loads plotly.js from a copy written next to
it, so the pages work offline and a folder of pages shares one copy of the library.
"""

import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

PLOTLY_JS = "plotly.min.js"
_COLORS = qualitative.Plotly


def ttft_cdf_figure(reports: Mapping[str, dict], max_points: int = 2_000) -> go.Figure:
    """TTFT CDF of each run (label -> report) over the requests that got a first token.

    A curve keeps at most `max_points` evenly spaced ranks (always the first and the last),
    so a page of whole-trace runs stays small.
    """
    figure = go.Figure()
    for index, (label, report) in enumerate(reports.items()):
        ttfts = sorted(r["ttft_s"] for r in report["requests"] if r["ttft_s"] is not None)
        step = max(1, math.ceil(len(ttfts) / max_points))
        ranks = sorted({*range(0, len(ttfts), step), len(ttfts) - 1} - {-1})
        figure.add_scatter(
            x=[ttfts[rank] for rank in ranks],
            y=[(rank + 1) / len(ttfts) for rank in ranks],
            name=label,
            mode="lines",
            line={"color": _color(index)},
        )
    slos = {report["config"].get("ttft_slo_s") for report in reports.values()} - {None}
    if len(slos) == 1:
        figure.add_vline(x=slos.pop(), line_dash="dot", annotation_text="TTFT SLO")
    figure.update_layout(
        title="TTFT CDF (requests that got a first token)",
        xaxis_title="TTFT (s)",
        yaxis_title="share of requests",
        yaxis_range=[0, 1.02],
    )
    return figure


def load_figure(reports: Mapping[str, dict], title: str = "Pool load over time") -> go.Figure:
    """Prefill (solid) and decode (dashed) pool load over time of each run; 1.0 is the SLO."""
    figure = go.Figure()
    is_single = len(reports) == 1
    for run_index, (label, report) in enumerate(reports.items()):
        series = report["series"]
        for pool_index, (pool, dash) in enumerate((("prefill", "solid"), ("decode", "dash"))):
            figure.add_scatter(
                x=series["t_s"],
                y=series[f"{pool}_load"],
                name=pool if is_single else f"{label} {pool}",
                mode="lines",
                # One run: a color per pool; several: a color per run, the pool by dash.
                line={"color": _color(pool_index if is_single else run_index), "dash": dash},
            )
    figure.add_hline(y=1.0, line_dash="dot", annotation_text="load 1 = at the SLO")
    figure.update_layout(
        title=title, xaxis_title="simulated time (s)", yaxis_title="load (predicted / SLO)"
    )
    return figure


def rejections_figure(reports: Mapping[str, dict]) -> go.Figure:
    """Rejections per time window, stacked by stage:reason, one panel per run side by side."""
    reasons = sorted({reason for r in reports.values() for reason in r["series"]["rejected"]})
    figure = make_subplots(
        rows=1, cols=max(len(reports), 1), shared_yaxes=True, subplot_titles=list(reports)
    )
    for column, report in enumerate(reports.values(), start=1):
        series = report["series"]
        for index, reason in enumerate(reasons):
            figure.add_bar(
                x=series["t_s"],
                y=series["rejected"].get(reason, [0] * len(series["t_s"])),
                name=reason,
                legendgroup=reason,
                showlegend=column == 1,
                marker_color=_color(index),
                row=1,
                col=column,
            )
        counts = series["rejected"].values()
        if not any(any(values) for values in counts):  # an empty panel says so
            figure.add_annotation(
                text="no rejections",
                showarrow=False,
                font={"size": 16, "color": "#666"},
                xref=f"x{column if column > 1 else ''} domain",
                yref=f"y{column if column > 1 else ''} domain",
                x=0.5,
                y=0.5,
            )
    figure.update_layout(
        title="Rejections over time by stage:reason", barmode="stack", yaxis_title="rejected"
    )
    figure.update_xaxes(title_text="simulated time (s)")
    figure.update_yaxes(rangemode="tozero", **count_ticks(_highest_stack(reports)))
    return figure


def count_ticks(highest: float, num_ticks: int = 5) -> dict[str, Any]:
    """Axis settings for counts up to `highest`: whole-number ticks from 0, about
    `num_ticks` of them (plotly's own choice reads 0.199 / 0.398 for a count of 1)."""
    rough = max(1.0, highest / num_ticks)
    power = 10 ** math.floor(math.log10(rough))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= rough)  # 1, 2, 5, 10, 20, ...
    return {"tick0": 0, "dtick": int(step), "range": None if highest else [0, 1]}


def _highest_stack(reports: Mapping[str, dict]) -> float:
    """The tallest stacked bar of a rejections figure."""
    stacks = [
        [sum(values) for values in zip(*report["series"]["rejected"].values(), strict=False)]
        for report in reports.values()
    ]
    return max((max(stack) for stack in stacks if stack), default=0)


def metric_vs_parameter_figure(
    table: Sequence[Mapping[str, object]],
    parameter: str,
    metrics: Sequence[str],
    group_by: Sequence[str] = (),
    title: str | None = None,
) -> go.Figure:
    """One line per metric and per value of the `group_by` columns, against `parameter`.

    Numeric parameters get a numeric axis; anything else ("inf", "8:8", None for unlimited)
    is shown as categories in the order they first appear in the table.
    """
    groups: dict[str, list[Mapping[str, object]]] = {}
    for row in table:
        key = ", ".join(f"{column}={row[column]}" for column in group_by)
        groups.setdefault(key, []).append(row)
    is_numeric = all(_is_finite_number(row[parameter]) for row in table)
    figure = go.Figure()
    index = 0
    for key, rows in groups.items():
        if is_numeric:
            rows = sorted(rows, key=lambda row: row[parameter])  # type: ignore[arg-type,return-value]
        for metric in metrics:
            name = " ".join(part for part in (key, metric if len(metrics) > 1 else "") if part)
            figure.add_scatter(
                x=[_axis_value(row[parameter], is_numeric) for row in rows],
                y=[row[metric] for row in rows],
                name=name or metric,
                mode="lines+markers",
                line={"color": _color(index)},
            )
            index += 1
    if not is_numeric:
        order = list(dict.fromkeys(_axis_value(row[parameter], False) for row in table))
        figure.update_xaxes(type="category", categoryorder="array", categoryarray=order)
    figure.update_layout(
        title=title or f"{', '.join(metrics)} vs {parameter}",
        xaxis_title=parameter,
        yaxis_title=metrics[0] if len(metrics) == 1 else ", ".join(metrics),
    )
    return figure


def write_page(figures: Mapping[str, go.Figure], path: Path, title: str) -> Path:
    """Write the figures on one HTML page at `path`, with plotly.min.js beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    library = path.parent / PLOTLY_JS
    if not library.exists():
        library.write_text(get_plotlyjs(), encoding="utf-8")
    divs = [
        figure.to_html(full_html=False, include_plotlyjs=False, div_id=f"figure-{name}")
        for name, figure in figures.items()
    ]
    page = (
        '<!DOCTYPE html>\n<html>\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n"
        f'<script src="{PLOTLY_JS}"></script>\n</head>\n<body>\n'
        f"<h1>{html.escape(title)}</h1>\n" + "\n".join(divs) + "\n</body>\n</html>\n"
    )
    path.write_text(page, encoding="utf-8")
    return path


def _color(index: int) -> str:
    return _COLORS[int(index) % len(_COLORS)]


def _is_finite_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _axis_value(value: object, is_numeric: bool) -> object:
    if is_numeric:
        return value
    return "unlimited" if value is None else str(value)
