"""The page `twin validate --out` writes: predicted vs measured per metric, TTFT CDFs."""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

SHOWN = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tbt_p50_s", "tbt_p90_s", "goodput_rps")


def validate_figure(result: Mapping[str, Any], raw: Sequence[Mapping[str, Any]]) -> go.Figure:
    """One bar pair (live, twin) per config for each metric, then every config's TTFT CDF
    live (solid) and predicted (dashed)."""
    configs = result["configs"]
    labels = [_label(c["change"]) for c in configs]
    rows = (len(SHOWN) + 2) // 3 + 1
    titles = [_title(name, configs) for name in SHOWN]
    titles += [""] * (3 * (rows - 1) - len(SHOWN)) + ["TTFT CDF: live (solid), twin (dashed)"]
    specs = [[{}, {}, {}] for _ in range(rows - 1)] + [[{"colspan": 3}, None, None]]
    figure = make_subplots(rows=rows, cols=3, subplot_titles=titles, specs=specs)
    for position, name in enumerate(SHOWN):
        row, col = position // 3 + 1, position % 3 + 1
        for side, color in (("live", "#1f77b4"), ("twin", "#ff7f0e")):
            figure.add_trace(
                go.Bar(
                    x=labels,
                    y=[c["metrics"][name][side] for c in configs],
                    name=side,
                    marker_color=color,
                    showlegend=position == 0,
                    legendgroup=side,
                ),
                row=row,
                col=col,
            )
    palette = ["#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"]
    for index, entry in enumerate(raw):
        color = palette[index % len(palette)]
        live = sorted(entry["live"]["ttfts_s"])
        twin = sorted(
            r["ttft_s"] for r in entry["twin"].get("requests", []) if r.get("ttft_s") is not None
        )
        for values, dash, side in ((live, "solid", "live"), (twin, "dash", "twin")):
            if not values:
                continue
            figure.add_trace(
                go.Scatter(
                    x=[v * 1000 for v in values],
                    y=np.arange(1, len(values) + 1) / len(values),
                    mode="lines",
                    line={"color": color, "dash": dash},
                    name=f"{labels[index]} {side}",
                ),
                row=rows,
                col=1,
            )
    figure.update_xaxes(title_text="TTFT (ms)", type="log", row=rows, col=1)
    figure.update_yaxes(title_text="share of requests", row=rows, col=1)
    figure.update_layout(
        title="twin validate: live vs predicted, per config", barmode="group", height=320 * rows
    )
    return figure


def _label(change: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in change.items()) or "base"


def _title(name: str, configs: Sequence[Mapping[str, Any]]) -> str:
    errors = [c["metrics"][name]["rel_err"] for c in configs]
    worst = max((abs(e) for e in errors if e is not None), default=None)
    return f"{name} (worst error {worst:.0%})" if worst is not None else name
