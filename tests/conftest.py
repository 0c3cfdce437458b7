"""Shared fixtures: the shipped trace and small helpers every suite may use."""

from pathlib import Path

import pytest

from backend.traces import SHIPPED_TRACE


@pytest.fixture(scope="session")
def shipped_trace() -> Path:
    """The real one-hour Mooncake conversation trace shipped with the package."""
    return SHIPPED_TRACE
