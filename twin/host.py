"""SharedHost: the twin's agents crowding one machine's cores, by processor sharing.

A live profile of agents that shared one host carries their solo times and the cores they
got (`host.cores`, backend/observe/host_share.py). The twin slows them by the same rule:
while n instances compute at once, each progresses at min(1, cores / n). A prefill counts
while it computes; a decode instance while its batch is not empty. Every change of that
rate wakes the prefills in progress (they recompute when they will end) and tells the
decode instances, which re-time their current step.
"""

from collections.abc import Callable, Generator
from typing import Any

import simpy


class SharedHost:
    """Who computes on the host now, and how fast each of them goes."""

    def __init__(self, env: simpy.Environment, cores: float) -> None:
        if not cores > 0:
            raise ValueError(f"a host needs cores > 0, got {cores}")
        self.env = env
        self.cores = cores
        self.num_busy = 0
        self._changed = env.event()
        self._listeners: dict[object, Callable[[], None]] = {}

    @property
    def rate(self) -> float:
        """How fast each busy instance progresses (1 alone; less when crowded)."""
        return min(1.0, self.cores / self.num_busy) if self.num_busy else 1.0

    def listen(self, owner: object, callback: Callable[[], None]) -> None:
        """Call `callback` after every change of the rate that `owner` did not make itself
        (decode instances re-time their step)."""
        self._listeners[owner] = callback

    def enter(self, owner: object = None) -> None:
        rate = self.rate
        self.num_busy += 1
        self._notify_if_changed(rate, owner)

    def leave(self, owner: object = None) -> None:
        assert self.num_busy > 0
        rate = self.rate
        self.num_busy -= 1
        self._notify_if_changed(rate, owner)

    def run(self, solo_s: float) -> Generator[Any, Any, None]:
        """Compute `solo_s` seconds of solo work, slowed while the host is crowded."""
        env = self.env
        self.enter()
        remaining_s = solo_s
        try:
            while True:
                rate, started_s, changed = self.rate, env.now, self._changed
                timer = env.timeout(remaining_s / rate)
                yield env.any_of([timer, changed])
                if timer.processed:
                    return
                remaining_s -= (env.now - started_s) * rate
        finally:
            self.leave()

    def _notify_if_changed(self, rate_before: float, source: object) -> None:
        """Wake the prefills in progress and re-time the decode batches, unless the rate
        stayed (fewer busy instances than cores)."""
        if self.rate == rate_before:
            return
        changed, self._changed = self._changed, self.env.event()
        changed.succeed()
        for owner, callback in self._listeners.items():
            if owner is not source:
                callback()
