"""Fixtures of the trace suite: small traces written to a temporary directory."""

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from backend.traces.loader import TraceRow, load_trace

WriteTrace = Callable[[Sequence[dict | str]], Path]


@pytest.fixture
def write_trace(tmp_path: Path) -> WriteTrace:
    """Write rows (dicts become JSON lines, strings are written as they are) to a file."""

    def write(rows: Sequence[dict | str]) -> Path:
        path = tmp_path / "trace.jsonl"
        lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
        path.write_text("".join(line + "\n" for line in lines))
        return path

    return write


@pytest.fixture(scope="session")
def shipped_rows(shipped_trace: Path) -> list[TraceRow]:
    """Every row of the shipped trace, loaded once."""
    return load_trace(shipped_trace)
