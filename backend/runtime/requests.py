"""One submitted request as its caller sees it: streamed tokens, then one terminal outcome."""

import asyncio
import contextlib
import itertools
import math
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from backend.db.records import RequestOutcome
from backend.policy.effects import DispatchPrefill


@dataclass(frozen=True, slots=True)
class Sampling:
    """How decode picks tokens; temperature 0 is greedy."""

    temperature: float = 0.0
    top_k: int = 0
    seed: int = 0
    ignore_eos: bool = False  # generate max_tokens even past the model's end of sequence
    logprobs: bool = False  # each token's log-probability comes with it
    top_logprobs: int = 0  # and this many most likely alternatives (0-20)


@dataclass(frozen=True, slots=True)
class Logprob:
    """A generated token's log-probability under the model, and the most likely
    (token id, log-probability) alternatives, most likely first."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


_END = object()


class AgentCall(Protocol):
    """An agent call in flight (a gRPC future or response stream): it can be cancelled."""

    def cancel(self) -> bool: ...


@dataclass(eq=False)
class RequestStream:
    """Tokens as they arrive (iterate it) and the single terminal `outcome` (`result()`).

    `decisions` are the DispatchPrefill effects made for the request (a re-route adds one);
    `retry_after_s` is set on admission rejections. The runtime writes, the caller reads.
    """

    request_id: str
    token_ids: tuple[int, ...]
    max_tokens: int
    sampling: Sampling
    arrival_s: float
    on_token: Callable[[int], None] | None = None
    tokens: list[int] = field(default_factory=list)
    # One per token when `sampling.logprobs` (pushed before its token is streamed).
    logprobs: list[Logprob | None] = field(default_factory=list)
    first_logprob: Logprob | None = None  # the prefill's, for the first token
    token_times_s: list[float] = field(default_factory=list)  # when each token arrived
    # When the decode agent produced each token (its clock; DecodeMessage.produced_s).
    token_produced_s: list[float] = field(default_factory=list)
    block_keys: tuple[int, ...] = ()
    decisions: list[DispatchPrefill] = field(default_factory=list)
    outcome: RequestOutcome | None = None
    retry_after_s: float | None = None
    num_reused_tokens: int = 0
    num_fetched_tokens: int = 0
    dispatch: DispatchPrefill | None = None  # the prefill the core currently expects
    stage: str = "prefill"  # "decode" once its prefill finished
    prefill_answered_s: float | None = None  # when the prefill agent answered
    prefill_agent_s: float = 0.0  # the agent's own time in that call (queue included)
    prefill_answer_s: float | None = None  # the answer's way back (None: not stamped)
    decode_instance_id: str | None = None  # once its decode is dispatched
    call: AgentCall | None = None  # the agent call it waits on now, cancelled with it
    num_retries: int = 0  # dispatches placed again after a hand-off failed (at most one)
    _queue: "queue.Queue[object]" = field(default_factory=queue.Queue)
    _done: threading.Event = field(default_factory=threading.Event)
    _wake: Callable[[], None] | None = None  # an async reader's, see __aiter__

    def __iter__(self) -> Iterator[int]:
        """The tokens, blocking this thread between them (one reader, sync or async)."""
        while (item := self._queue.get()) is not _END:
            yield item  # type: ignore[misc]

    async def __aiter__(self) -> AsyncIterator[int]:
        """The tokens, on the caller's event loop without a thread: the writer wakes the
        loop after each put (one reader, sync or async)."""
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        self._wake = lambda: loop.call_soon_threadsafe(ready.set)
        try:
            while True:
                ready.clear()
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    await ready.wait()
                    continue
                if item is _END:
                    return
                yield item  # type: ignore[misc]
        finally:
            self._wake = None

    def _put(self, item: object) -> None:
        self._queue.put(item)
        wake = self._wake
        if wake is not None:
            with contextlib.suppress(RuntimeError):  # the reader's loop has closed
                wake()

    def result(self, timeout_s: float | None = None) -> RequestOutcome:
        """Wait for the terminal outcome; TimeoutError if it has not come in `timeout_s`."""
        if not self._done.wait(timeout_s):
            raise TimeoutError(f"request {self.request_id} has no outcome after {timeout_s} s")
        assert self.outcome is not None
        return self.outcome

    @property
    def is_finished(self) -> bool:
        return self.outcome is not None

    def push_token(
        self,
        token: int,
        now_s: float,
        logprob: Logprob | None = None,
        produced_s: float | None = None,
    ) -> None:
        """A token arrived at `now_s`; `produced_s`: when its agent produced it (None or 0
        from an agent that does not stamp)."""
        if self.sampling.logprobs:
            self.logprobs.append(logprob)
        self.tokens.append(token)
        self.token_times_s.append(now_s)
        if produced_s:
            self.token_produced_s.append(produced_s)
        self._put(token)
        if self.on_token is not None:
            self.on_token(token)

    def tbt_gaps_s(self) -> list[float]:
        """The gaps between the request's tokens as its decode agent produced them (TBT,
        backend/observe/measures.py); the gaps as they arrived where some token came
        unstamped. Arrival gaps carry delivery's bunching: under load a third of them were
        under a millisecond, two tokens read at once, where no decode step is that short."""
        times = self.token_produced_s
        if len(times) != len(self.tokens):
            times = self.token_times_s
        return [b - a for a, b in itertools.pairwise(times)]

    def tbt_s(self) -> tuple[float, float, float] | None:
        """Mean, p99 and max of the gaps between tokens (`tbt_gaps_s`); None under two."""
        return gap_summary(self.tbt_gaps_s())

    def close(self) -> None:
        """Called once, after `outcome` is set."""
        self._put(_END)
        self._done.set()


def gap_summary(gaps: Sequence[float]) -> tuple[float, float, float] | None:
    """Mean, p99 and max of a request's token gaps; None when there are none."""
    if not gaps:
        return None
    ordered = sorted(gaps)
    p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
    return sum(ordered) / len(ordered), p99, ordered[-1]
