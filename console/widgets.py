"""Pieces several pages share: the time-window picker, a row of report metrics, a chart and
a dataframe of plain rows."""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from console import format as fmt
from console.connection import settings

WINDOWS_S: dict[str, float] = {
    "last 1 min": 60.0,
    "last 5 min": 300.0,
    "last 15 min": 900.0,
    "last 1 h": 3600.0,
    "last 6 h": 6 * 3600.0,
    "last 24 h": 24 * 3600.0,
}
DEFAULT_WINDOW = "last 5 min"
WINDOW_KEY = "window"
# The choice outlives the widget: Streamlit drops a widget's state when its page is left.
WINDOW_CHOICE_KEY = "window_choice"


def refresh_interval_s(window_s: float, base_s: float) -> float:
    """How often a page over `window_s` refreshes: every `base_s`, slower for long windows.
    Their series windows are long (about 60 of them) and the backend reads the whole window
    each time (about 0.75 s per hour of traffic), so a 24-hour view refreshes every 2.4 min."""
    return max(base_s, window_s / 600.0)


def refreshed_window_panel(panel: Callable[[float], None], *, key: str) -> None:
    """The time-window picker and a refresh toggle, then `panel(window_s)` in a fragment that
    redraws in place at the window's refresh interval while the toggle is on."""
    controls = st.columns([2, 2, 4])
    with controls[0]:
        window_s = window_picker()
    with controls[1]:
        refresh_s = refresh_interval_s(window_s, settings().refresh_s)
        is_live = st.toggle(f"Refresh every {refresh_s:g} s", value=True, key=key)
    st.fragment(panel, run_every=refresh_s if is_live else None)(window_s)


def window_picker() -> float:
    """The window the page reports on, in seconds; the same on every page."""
    names = list(WINDOWS_S)
    current = st.session_state.get(WINDOW_CHOICE_KEY, DEFAULT_WINDOW)
    chosen = st.selectbox("Time window", names, index=names.index(current), key=WINDOW_KEY)
    st.session_state[WINDOW_CHOICE_KEY] = chosen
    return WINDOWS_S[chosen]


def metric_row(
    report: Mapping[str, Any], metrics: Sequence[tuple[str, str]], help_by_name=None
) -> None:
    """One st.metric per (label, report key), formatted by the key's unit."""
    helps = help_by_name or {}
    for column, (label, name) in zip(st.columns(len(metrics)), metrics, strict=True):
        column.metric(label, fmt.metric(name, report.get(name)), help=helps.get(name))


def chart(figure: go.Figure, key: str) -> None:
    """A plotly chart without its tool bar, which would cover the title; dragging still
    zooms and a double click resets."""
    st.plotly_chart(figure, key=key, config={"displayModeBar": False})


MAX_ROWS_IN_VIEW = 30
_ROW_HEIGHT_PX = 35  # streamlit's dataframe row


def table(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str] | None = None,
    widths: Mapping[str, str] | None = None,
) -> None:
    """Rows as a dataframe (index hidden); `columns` orders and selects them, `widths` sets
    some columns' width ("small", "medium", "large")."""
    frame = pd.DataFrame(list(rows), columns=list(columns) if columns else None)
    config = {name: st.column_config.Column(width=width) for name, width in (widths or {}).items()}
    # Every row in view up to MAX_ROWS_IN_VIEW (streamlit's default shows about ten, so a
    # "top 20" read as a top 10); longer tables scroll.
    height: int | str = (
        _ROW_HEIGHT_PX * (len(frame) + 1) + 3 if len(frame) <= MAX_ROWS_IN_VIEW else "auto"
    )
    st.dataframe(
        frame, hide_index=True, width="stretch", height=height, column_config=config or None
    )


def wrapped_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> None:
    """Rows as a static table whose cells wrap (a dataframe cuts long text off); the first
    column labels the rows."""
    if not rows:
        st.info("Nothing recorded yet.")
        return
    frame = pd.DataFrame(list(rows), columns=list(columns)).set_index(columns[0])
    st.table(frame)
