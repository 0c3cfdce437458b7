"""The supervisor of `kvcentric up`'s children, on real processes: a child that dies is
reported and started again after its backoff with the same command line, its log kept; one
that keeps dying is named in a ChildFailed."""

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from backend.cli.children import Child, ChildFailed, Supervisor


def _poll_until(supervisor: Supervisor, condition, timeout_s: float = 10.0) -> None:
    deadline_s = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline_s, "timed out"
        supervisor.poll()
        time.sleep(0.02)


def test_a_killed_child_is_reported_and_started_again(tmp_path: Path) -> None:
    args = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"]
    child = Child("agent prefill-0", args, dict(os.environ), tmp_path / "a.log", stdout_pipe=False)
    reports: list[str] = []
    supervisor = Supervisor([child], reports.append, first_backoff_s=0.1)
    try:
        first = child.process.pid
        os.kill(first, signal.SIGKILL)
        _poll_until(supervisor, lambda: supervisor.num_restarts == 1)
        assert child.process.pid != first and child.process.poll() is None
        assert reports[0].startswith("agent prefill-0 exited with code -9; starting it again")
        assert reports[1] == f"agent prefill-0 restarted (pid {child.process.pid})"
        _poll_until(supervisor, lambda: child.log.read_text().count("up") == 2)
        assert "restarted by the supervisor" in child.log.read_text()
    finally:
        child.terminate()
        child.wait()


def test_a_child_that_keeps_dying_stops_the_supervision_naming_it(tmp_path: Path) -> None:
    args = [sys.executable, "-c", "raise SystemExit(3)"]
    child = Child("conductor", args, dict(os.environ), tmp_path / "c.log", stdout_pipe=False)
    reports: list[str] = []
    supervisor = Supervisor([child], reports.append, first_backoff_s=0.05, max_exits=3)
    try:
        with pytest.raises(ChildFailed) as failed:
            _poll_until(supervisor, lambda: False)
        assert str(failed.value).startswith("conductor keeps dying: 3 exits in 120 s")
        assert "code 3" in str(failed.value) and str(child.log) in str(failed.value)
        # The backoff doubled: 0.05 s, then 0.1 s.
        assert [r.split("again in ")[1].split(" s")[0] for r in reports if "again in" in r] == [
            "0.05",
            "0.1",
        ]
    finally:
        child.wait()
