"""SharedHost: the twin's agents crowding one machine's cores, by processor sharing.

A live profile of agents that shared one host carries their solo times and the cores they
got (`host`, backend/observe/host_share.py): overall, and as each role saw them (measured
on a 2-CPU host the decode loop kept three quarters of its CPU time beside two prefill
agents that kept half of theirs). The twin slows them by the same rule: while n instances
compute at once, a prefill progresses at min(1, prefill cores / n) and a decode step at
min(1, decode cores / n), or, where the live profile measured it, at the share of a core
its decode steps or prefills got with n agents busy: a decode batch at one place in the
measured spread per stretch of constant batch, kept while the count changes under it (the
scheduler runs the waking decode loop ahead of long prefills, so on a 2-CPU host it kept
80-93 % of a core at one to three busy agents where the even share gives 58-100 %),
a prefill at one place in the measured spread for its whole length (a short prefill gets
a core at once or waits: 1.2x to 4.3x its CPU time where the even share gives 2.1x). A
prefill counts while it computes; a decode instance while its batch is not empty. Every
change of the count wakes the prefills in progress (they recompute when they will end)
and tells the decode instances, which re-time their current step.
"""

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Literal

import simpy

from backend.observe.host_share import Background, DecodeLength

Role = Literal["prefill", "decode"]
# The background follows the admissions of about the last this many seconds.
BACKGROUND_MEMORY_S = 2.0
# What the agents keep of the host however busy the rest is (a guard, never reached live).
MIN_AGENT_CORES = 0.1


@dataclass(frozen=True, slots=True)
class HostCores:
    """The cores a prefill and a decode instance each behave as sharing (one host)."""

    prefill: float
    decode: float
    # What the host's other processes took in the measured window (a live profile read on
    # the Conductor's own host); None: the shares as measured, whatever the load.
    background: Background | None = None
    # How a decode step's measured share falls with its length (its measured shares are
    # then as at the reference length); None: whatever its length.
    decode_length: DecodeLength | None = None

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
        # Admissions per second (decaying over BACKGROUND_MEMORY_S), from the window's own
        # rate: what the background grows with.
        rest = cores.background
        self._per_request_s = rest.cpu_s_per_request if rest is not None else 0.0
        self._admissions_per_s = rest.cores / self._per_request_s if self._per_request_s else 0.0
        self._admissions_at_s = env.now

    def rate(
        self, role: Role, share: Callable[[int], float] | None = None, solo_s: float = 0.0
    ) -> float:
        """How fast each busy instance of `role` progresses (1 alone; less when crowded):
        at `share(busy agents)` of a core where given (measured; a decode step's scaled by
        its length `solo_s` where the profile measured how its share falls with it), else
        processor sharing's; then by the background's change since the measured window."""
        num_busy = self.num_busy
        if share is not None:
            rate = share(num_busy)
            if role == "decode" and self.cores.decode_length is not None:
                rate = min(1.0, rate * self.cores.decode_length.factor(solo_s))
        else:
            cores = self.cores.prefill if role == "prefill" else self.cores.decode
            rate = min(1.0, cores / num_busy) if num_busy else 1.0
        return rate * self._background_factor()

    def admitted(self) -> None:
        """A request was admitted: the work it brings the host's other processes (the
        Conductor's, its client's, its tokens' streaming) joins the background."""
        if not self._per_request_s:
            return
        self._admissions_per_s = self._decayed_admissions_per_s() + 1.0 / BACKGROUND_MEMORY_S
        self._admissions_at_s = self.env.now
        self._notify(None)

    def background_cores(self) -> float:
        """The cores the host's other processes take now."""
        return self._per_request_s * self._decayed_admissions_per_s()

    def _decayed_admissions_per_s(self) -> float:
        elapsed_s = self.env.now - self._admissions_at_s
        return self._admissions_per_s * math.exp(-elapsed_s / BACKGROUND_MEMORY_S)

    def _background_factor(self) -> float:
        """The busy agents' share of the host under today's background over their share
        under the measured window's, which the measured rates carry: while n agents compute
        on c CPUs beside a background of b cores, each gets min(1, (c - b) / n). On a 2-CPU
        host with three busy agents, 0.32 cores of background where the window had 0.25
        gives 0.96: the window's second half at speed 8 (see host_share.background)."""
        rest = self.cores.background
        if rest is None or not self._per_request_s or not self.num_busy:
            return 1.0

        def agents_share(background_cores: float) -> float:
            free = max(rest.num_cpus - background_cores, MIN_AGENT_CORES)
            return min(1.0, free / self.num_busy)

        return agents_share(self.background_cores()) / agents_share(rest.cores)

    def listen(self, owner: object, callback: Callable[[], None]) -> None:
        """Call `callback` after every change of the count that `owner` did not make itself
        (decode instances re-time their step)."""
        self._listeners[owner] = callback

    def enter(self, owner: object = None) -> None:
        self.num_busy += 1
        self._notify(owner)

    def leave(self, owner: object = None) -> None:
        assert self.num_busy > 0
        self.num_busy -= 1
        self._notify(owner)

    def run(
        self, solo_s: float, share: Callable[[int], float] | None = None
    ) -> Generator[Any, Any, None]:
        """Compute `solo_s` seconds of a prefill's solo work, slowed while the host is
        crowded: at `share(busy agents)` of a core where given, else processor sharing's."""
        env = self.env
        self.enter()
        remaining_s = solo_s
        try:
            while True:
                rate = self.rate("prefill", share)
                started_s, changed = env.now, self._changed
                timer = env.timeout(remaining_s / rate)
                yield env.any_of([timer, changed])
                if timer.processed:
                    return
                remaining_s -= (env.now - started_s) * rate
        finally:
            self.leave()

    def _notify(self, source: object) -> None:
        """Wake the prefills in progress and re-time the decode batches: their rates
        depend on the count."""
        changed, self._changed = self._changed, self.env.event()
        changed.succeed()
        for owner, callback in self._listeners.items():
            if owner is not source:
                callback()
