"""PrefillLine: one prefill at a time, the waiting ones in the Conductor's order.

The Conductor keeps a line per prefill agent and believes its head is the prefill running
(backend/runtime/runner.py): its queue estimate counts what the head has left, and its pace
reads a head that runs long as a slow agent. Dispatches leave it in line order, but the
agent's server hands them to its threads, which race for the worker: at speed 8 on two
cores one adjacent pair in eight ran in the other order, up to a 169-token prompt waiting
1.9 s behind two longer ones dispatched 4-8 ms after it, while the Conductor took it for
running and its pace for the agent rose to 3.2x, refusing a burst that live then served
well within its SLO. Each dispatch carries its place in the line (`line_position`); a
waiting prefill goes next when its position is the lowest waiting (arrival order among
equal positions, so requests without one are served first come first served).
"""

import heapq
import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(slots=True)
class Turn:
    """A prefill's turn on the worker. `handover_s`: from the prefill ahead letting the
    worker go to this one holding it, where this one waited for it (the line's hand-over:
    a waiting thread woken on a busy host, time no prefill's measured seconds hold); None
    where it found the worker free."""

    handover_s: float | None = None


class PrefillLine:
    """The agent's prefill worker, taken in line order; `turn(position)` holds it."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._busy = False
        self._waiting: list[tuple[int, int]] = []  # (position, arrival): a heap
        self._arrivals = itertools.count()
        self._released_s = 0.0  # when the worker was last let go (time.perf_counter)

    @contextmanager
    def turn(self, position: int = 0) -> Iterator[Turn]:
        """Wait until no prefill runs and none waiting has a lower position, then run."""
        turn = Turn()
        with self._changed:
            ticket = (position, next(self._arrivals))
            heapq.heappush(self._waiting, ticket)
            waited = False
            while self._busy or self._waiting[0] != ticket:
                waited = True
                self._changed.wait()
            heapq.heappop(self._waiting)
            self._busy = True
            if waited:
                turn.handover_s = max(0.0, time.perf_counter() - self._released_s)
        try:
            yield turn
        finally:
            with self._changed:
                self._busy = False
                self._released_s = time.perf_counter()
                self._changed.notify_all()

    @property
    def num_waiting(self) -> int:
        with self._changed:
            return len(self._waiting)
