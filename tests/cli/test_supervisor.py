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


def _nice_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])  # field 19, after the command's name


def test_an_agent_child_yields_the_cpu_to_the_conductor_and_keeps_doing_so_on_restart(
    tmp_path: Path,
) -> None:
    """Agents start at AGENT_NICE, their session too (each child has a session of its own,
    and with the kernel's autogroup a nice value alone would rank threads only inside one);
    the threads they start inherit it; a restarted agent gets it again."""
    from backend.cli.children import AGENT_NICE

    code = "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start()"
    args = [sys.executable, "-c", code]
    child = Child(
        "agent", args, dict(os.environ), tmp_path / "a.log", stdout_pipe=False, nice=AGENT_NICE
    )
    supervisor = Supervisor([child], lambda line: None, first_backoff_s=0.05)
    try:
        for attempt in range(2):
            pid = child.process.pid
            assert _nice_of(pid) == AGENT_NICE
            autogroup = Path(f"/proc/{pid}/autogroup")
            if autogroup.exists():  # "/autogroup-N nice 10"
                assert autogroup.read_text().split()[-1] == str(AGENT_NICE)
            deadline_s = time.monotonic() + 5
            while len(list(Path(f"/proc/{pid}/task").iterdir())) < 2:
                assert time.monotonic() < deadline_s
                time.sleep(0.02)
            for task in Path(f"/proc/{pid}/task").iterdir():
                stat = (task / "stat").read_text()
                assert int(stat.rsplit(")", 1)[1].split()[16]) == AGENT_NICE
            if attempt == 0:
                os.kill(pid, signal.SIGKILL)
                _poll_until(supervisor, lambda: supervisor.num_restarts == 1)
    finally:
        child.terminate()
        child.wait()
