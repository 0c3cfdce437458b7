"""Shared page pieces that need no backend."""

from console.widgets import WINDOWS_S, refresh_interval_s


def test_short_windows_refresh_at_the_base_rate_and_long_ones_slower() -> None:
    assert refresh_interval_s(WINDOWS_S["last 5 min"], 2.0) == 2.0
    assert refresh_interval_s(WINDOWS_S["last 1 h"], 2.0) == 6.0
    assert refresh_interval_s(WINDOWS_S["last 24 h"], 2.0) == 144.0
