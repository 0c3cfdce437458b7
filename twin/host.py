"""SharedHost: the twin's agents crowding one machine's cores, by processor sharing.

A live profile of agents that shared one host carries their solo times and the cores they
got (`host`, backend/observe/host_share.py): overall, and as each role saw them (measured
on a 2-CPU host the decode loop kept three quarters of its CPU time beside two prefill
agents that kept half of theirs). The twin slows them by the same rule: while n instances
compute at once, a prefill progresses at min(1, prefill cores / n) and a decode step at
min(1, decode cores / n), or, where the live profile measured it, at the share of a core
its decode steps got with n agents busy (drawn per stretch of steps: the scheduler runs
the waking decode loop ahead of long prefills, so on a 2-CPU host it kept 80-93 % of a core
at one to three busy agents where the even share gives 58-100 %). A prefill counts while
it computes; a decode instance while its batch is not empty. A change of the prefills'
rate wakes the prefills in progress (they recompute when they will end); every change of
the count tells the decode instances, which re-time their current step.
"""

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Literal

import simpy

Role = Literal["prefill", "decode"]


@dataclass(frozen=True, slots=True)
class HostCores:
    """The cores a prefill and a decode instance each behave as sharing (one host)."""

    prefill: float
    decode: float

    def __post_init__(self) -> None:
        for role in ("prefill", "decode"):
            if not getattr(self, role) > 0:
                raise ValueError(f"a host needs {role} cores > 0, got {getattr(self, role)}")


class SharedHost:
    """Who computes on the host now, and how fast each of them goes."""

    def __init__(self, env: simpy.Environment, cores: HostCores) -> None:
        self.env = env
        self.cores = cores
        self.num_busy = 0
        self._changed = env.event()
        self._listeners: dict[object, Callable[[], None]] = {}

    def rate(self, role: Role) -> float:
        """How fast each busy instance of `role` progresses (1 alone; less when crowded)."""
        cores = self.cores.prefill if role == "prefill" else self.cores.decode
        return min(1.0, cores / self.num_busy) if self.num_busy else 1.0

    def listen(self, owner: object, callback: Callable[[], None]) -> None:
        """Call `callback` after every change of the count that `owner` did not make itself
        (decode instances re-time their step)."""
        self._listeners[owner] = callback

    def enter(self, owner: object = None) -> None:
        prefill_rate = self.rate("prefill")
        self.num_busy += 1
        self._notify(prefill_rate, owner)

    def leave(self, owner: object = None) -> None:
        assert self.num_busy > 0
        prefill_rate = self.rate("prefill")
        self.num_busy -= 1
        self._notify(prefill_rate, owner)

    def run(self, solo_s: float) -> Generator[Any, Any, None]:
        """Compute `solo_s` seconds of a prefill's solo work, slowed while the host is crowded."""
        env = self.env
        self.enter()
        remaining_s = solo_s
        try:
            while True:
                rate, started_s, changed = self.rate("prefill"), env.now, self._changed
                timer = env.timeout(remaining_s / rate)
                yield env.any_of([timer, changed])
                if timer.processed:
                    return
                remaining_s -= (env.now - started_s) * rate
        finally:
            self.leave()

    def _notify(self, prefill_rate_before: float, source: object) -> None:
        """Wake the prefills in progress if their rate changed, and re-time the decode
        batches (a measured decode rate depends on the count itself)."""
        if self.rate("prefill") != prefill_rate_before:
            changed, self._changed = self._changed, self.env.event()
            changed.succeed()
        for owner, callback in self._listeners.items():
            if owner is not source:
                callback()
