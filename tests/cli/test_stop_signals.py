"""A stack's stop runs to its end when Ctrl-C or SIGTERM lands during it (`stop_stack`
under `stop_on_signals`, as `twin validate` stops each configuration's stack): the signal
is raised once every child is stopped, on real processes."""

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.cli.children import Child, stop_on_signals, stop_stack

# A child that takes two seconds to stop, as an agent finishing its work does.
_SLOW_TO_STOP = (
    "import signal, sys, time\n"
    "def stop(*_):\n"
    "    print('stopping', flush=True)\n"
    "    time.sleep(2.0)\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "print('up', flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def handlers_restored() -> Iterator[None]:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


def _stack(tmp_path: Path) -> list[Child]:
    children = [
        Child(name, [sys.executable, "-c", _SLOW_TO_STOP], dict(os.environ),
              tmp_path / f"{name}.log", stdout_pipe=False)
        for name in ("conductor", "agent prefill-0", "agent decode-0")
    ]  # fmt: skip
    deadline_s = time.monotonic() + 30
    while not all("up" in c.log.read_text() for c in children):
        if time.monotonic() > deadline_s:
            for child in children:  # none outlives the failed test
                child.process.kill()
            pytest.fail("children did not start")
        time.sleep(0.05)
    return children


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_the_stop_is_raised_once_every_child_is_stopped(
    tmp_path: Path, handlers_restored: None, signum: int
) -> None:
    children = _stack(tmp_path)
    stop_on_signals()
    agent = children[1]

    def signal_once_the_agents_stop() -> None:
        deadline_s = time.monotonic() + 30
        while "stopping" not in agent.log.read_text() and time.monotonic() < deadline_s:
            time.sleep(0.01)
        os.kill(os.getpid(), signum)

    sender = threading.Thread(target=signal_once_the_agents_stop)
    sender.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            stop_stack(None, children)
    finally:
        sender.join()
        for child in children:
            if child.process.poll() is None:
                child.process.kill()
    assert [c.process.poll() for c in children] == [0, 0, 0]  # each stopped on its own
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # a second is ignored


def test_a_stop_without_a_signal_leaves_the_handlers_in_force(
    tmp_path: Path, handlers_restored: None
) -> None:
    children = _stack(tmp_path)
    stop_on_signals()
    in_force = signal.getsignal(signal.SIGTERM)
    stop_stack(None, children)
    assert [c.process.poll() for c in children] == [0, 0, 0]
    assert signal.getsignal(signal.SIGTERM) is in_force
    assert signal.getsignal(signal.SIGINT) is in_force
