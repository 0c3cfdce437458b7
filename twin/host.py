"""SharedHost: the twin's agents crowding one machine's cores, by processor sharing.

A live profile of agents that shared one host carries their solo times and the cores they
got (`host`, backend/observe/host_share.py): overall, and as each role saw them (measured
on a 2-CPU host the decode loop kept three quarters of its CPU time beside two prefill
agents that kept half of theirs). The twin slows them by the same rule: while n instances
compute at once, a prefill progresses at min(1, prefill cores / n) and a decode step at
min(1, decode cores / n), or, where the live profile measured it, at the share of a core
its decode steps or prefills got with n agents busy: a decode step at one place in the
measured spread, kept while the count changes under it (the scheduler runs the waking
decode loop ahead of long prefills, so on a 2-CPU host it kept 80-93 % of a core at one to
three busy agents where the even share gives 58-100 %), and scaled by the step's length
where the profile measured how the share falls with it (a 3-5 ms step kept 0.80-0.85 of a
core at three busy agents, a 20-30 ms one 0.58-0.65),
a prefill at one place in the measured spread for its whole length (a short prefill gets
a core at once or waits: 1.2x to 4.3x its CPU time where the even share gives 2.1x). A
prefill counts while it computes; a decode instance while its batch is not empty. Every
change of the count wakes the prefills in progress (they recompute when they will end)
and tells the decode instances, which re-time their current step.

Where the profile measured what the rest of the host spent while the agents served
(`host.other`: the Conductor, the clients, the agents' other threads; so many cores at so
many prefills a second), the shares are as measured at that load: a twin serving more
prefills a second leaves its agents less of the host (the rest's CPU grows with the
prefills, `HostOther.per_prefill_s` each, above its background `idle_cores`), one serving
fewer, more. With n busy agents on `cpus` CPUs of which the rest takes o, each gets
min(1, (cpus - o) / n); the measured shares are scaled by that over the same at the
measured o.
"""

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Literal

import simpy

from backend.observe.host_share import DecodeLength, HostOther

Role = Literal["prefill", "decode"]

# The twin's prefills a second, exponentially weighted over this long, are the load the rest
# of the host's CPU follows (the Conductor's and the clients' work for a request spans its
# life of a second or two). On 28 kept runs at speed 7 (machine A, 2P:1D and 1P:2D) the
# twin's refusals summed to -10 % of live's without the rest's CPU, -5 % with it at 10 s
# (its window's 17 s too short to follow the load up) and +1 % at 3 s.
OTHER_RATE_TAU_S = 3.0
# The least of the host the agents are left, however busy the rest.
MIN_AGENT_CORES = 0.25


@dataclass(frozen=True, slots=True)
class HostCores:
    """The cores a prefill and a decode instance each behave as sharing (one host)."""

    prefill: float
    decode: float
    # How a decode step's measured share falls with its length (its measured shares are
    # then as at the reference length); None: whatever its length.
    decode_length: DecodeLength | None = None
    # What the rest of the host spent while the shares were measured; None: not measured
    # (the shares stand whatever the load).
    other: HostOther | None = None

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
        other = cores.other
        # Prefills a second (exponentially weighted), from the measured load.
        self._prefill_rate = (
            max(0.0, other.cores - other.idle_cores) / other.per_prefill_s
            if other and other.per_prefill_s > 0
            else 0.0
        )
        self._rate_at_s = env.now

    def note_prefill(self) -> None:
        """A prefill was dispatched: the rest of the host works for it (see `other`)."""
        now_s = self.env.now
        decay = math.exp(-(now_s - self._rate_at_s) / OTHER_RATE_TAU_S)
        self._prefill_rate = self._prefill_rate * decay + 1.0 / OTHER_RATE_TAU_S
        self._rate_at_s = now_s

    def other_factor(self, num_busy: int) -> float:
        """How much faster (> 1) or slower (< 1) each of `num_busy` agents goes than the
        measured shares say, the rest of the host busier or idler than it was measured."""
        other = self.cores.other
        if other is None or other.per_prefill_s <= 0 or num_busy < 1:
            return 1.0
        decay = math.exp(-(self.env.now - self._rate_at_s) / OTHER_RATE_TAU_S)
        now_cores = other.idle_cores + other.per_prefill_s * self._prefill_rate * decay

        def each(rest_cores: float) -> float:
            return min(1.0, max(other.cpus - rest_cores, MIN_AGENT_CORES) / num_busy)

        return each(now_cores) / each(other.cores)

    def rate(
        self, role: Role, share: Callable[[int], float] | None = None, solo_s: float = 0.0
    ) -> float:
        """How fast each busy instance of `role` progresses (1 alone; less when crowded):
        at `share(busy agents)` of a core where given (measured; a decode step's scaled by
        its length `solo_s` where the profile measured how its share falls with it), else
        processor sharing's."""
        num_busy = self.num_busy
        if share is None:
            cores = self.cores.prefill if role == "prefill" else self.cores.decode
            return min(1.0, cores / num_busy) if num_busy else 1.0
        rate = share(num_busy)
        if role == "decode" and self.cores.decode_length is not None:
            rate = min(1.0, rate * self.cores.decode_length.factor(solo_s))
        if self.cores.other is not None:
            rate = min(1.0, rate * self.other_factor(num_busy))
        return rate

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
