"""Shared fixtures: the shipped trace and small helpers every suite may use."""

from pathlib import Path

import pytest

from backend.traces import SHIPPED_TRACE


@pytest.fixture(scope="session")
def shipped_trace() -> Path:
    """The real one-hour Mooncake conversation trace shipped with the package."""
    return SHIPPED_TRACE


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """No agent process outlives the tests, whatever failed on the way."""
    from tests.harness.agents import kill_leftover_agents

    kill_leftover_agents()
