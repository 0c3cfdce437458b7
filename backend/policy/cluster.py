"""The core's view of each instance's work: prefill queues, decode batches, link backlogs.

Mutable state owned by the ConductorCore and changed only through its event handlers.
Running sums are kept so that every quantity Algorithm 1 and admission need is O(1) or
O(requests that change state); only early-predicted's forecast reads each decoding request
once per admission (each may end at its own time).
"""

import math
from dataclasses import dataclass, field


@dataclass(slots=True)
class RunningPrefill:
    started_s: float
    predicted_s: float


# How much of its weight each measured prefill keeps when the next one is added to the
# pace's sums (0.8: the last ~5 prefills count most), and the bound of the pace (a stalled
# call must not freeze admission).
PACE_DECAY = 0.8
MAX_PACE = 50.0


@dataclass(slots=True)
class PrefillState:
    """One prefill instance: its queue in predicted seconds and its outgoing link.

    `pace()` is how much longer than predicted this instance's prefills really take, as the
    instance measured its work on each (`PrefillFinished.took_s`; exponentially weighted
    seconds measured over seconds predicted, never under 1): it covers what the cost model
    leaves out (cores shared with other work, loading cached blocks, the KV hand-off) from one
    prefill to the next, where calibration refits the model every few seconds. T_queue and
    a new request's own prefill are scaled by it, so admission refuses a request that would
    wait past its SLO behind prefills slower than believed. A driver whose prefills take
    what the model predicts (the twin on its own profile) keeps a pace of 1.
    """

    instance_id: str
    queued_s: dict[str, float] = field(default_factory=dict)
    running: dict[str, RunningPrefill] = field(default_factory=dict)
    total_queued_s: float = 0.0
    link_busy_until_s: float = 0.0
    draining: bool = False  # takes no new requests
    # Exponentially weighted sums (see PACE_DECAY) of the finished prefills' measured and
    # predicted seconds: their ratio is the pace. A ratio of sums, not a mean of ratios, so
    # a prefill counts by its length: a tiny cached one that took 20x its 13 ms prediction
    # (a fixed cost of the call) does not make a long one look 20x slower.
    paced_measured_s: float = 0.0
    paced_predicted_s: float = 0.0

    def measured_pace(self) -> float | None:
        """Measured over predicted seconds of the finished prefills; None before the first."""
        if self.paced_predicted_s <= 0:
            return None
        # Rounded: prefills that took their prediction (the twin) give 1.0 exactly, not off
        # by the float error of the sums.
        return round(min(MAX_PACE, self.paced_measured_s / self.paced_predicted_s), 6)

    def pace(self, now_s: float, unmeasured: float = 1.0) -> float:
        """Measured over predicted prefill time, never under 1: that of the finished ones
        (`unmeasured` before the first: the other instances' pace), or more while a running
        prefill is already late: the pace as if it ended now (the first burst after a start
        must not wait for a prefill to finish)."""
        measured = self.measured_pace()
        pace = max(1.0, unmeasured if measured is None else measured)
        for run in self.running.values():
            if run.predicted_s > 0:
                elapsed_s = now_s - run.started_s
                if_ended_now = (PACE_DECAY * self.paced_measured_s + elapsed_s) / (
                    PACE_DECAY * self.paced_predicted_s + run.predicted_s
                )
                pace = max(pace, min(MAX_PACE, if_ended_now))
        return pace

    def queue_s(self, now_s: float, unmeasured_pace: float = 1.0, handover_s: float = 0.0) -> float:
        """T_queue: seconds of queued prefills plus what running ones have left, at `pace`,
        and the line's `handover_s` before each of them hands the worker on (a request
        joining a line of k waits k hand-overs that no prefill's measured seconds hold)."""
        pace = self.pace(now_s, unmeasured_pace)
        remaining = 0.0
        for run in self.running.values():
            left = run.started_s + run.predicted_s * pace - now_s
            if left > 0:
                remaining += left
        ahead = len(self.queued_s) + len(self.running)
        return self.total_queued_s * pace + remaining + ahead * handover_s

    def link_backlog_s(self, now_s: float) -> float:
        """Seconds of transfers already committed on this instance's outgoing link."""
        return max(0.0, self.link_busy_until_s - now_s)

    def enqueue(self, request_id: str, predicted_s: float) -> None:
        self.queued_s[request_id] = predicted_s
        self.total_queued_s += predicted_s

    def start(self, request_id: str, now_s: float) -> None:
        predicted_s = self.dequeue(request_id)
        if predicted_s is not None:
            self.running[request_id] = RunningPrefill(started_s=now_s, predicted_s=predicted_s)

    def dequeue(self, request_id: str) -> float | None:
        predicted_s = self.queued_s.pop(request_id, None)
        if predicted_s is not None:
            self.total_queued_s = self.total_queued_s - predicted_s if self.queued_s else 0.0
        return predicted_s

    def finish(
        self, request_id: str, now_s: float | None = None, took_s: float | None = None
    ) -> None:
        """The prefill ended; `now_s` when it completed (it then updates `pace`), None
        when it was dropped. `took_s`: the seconds the instance measured it worked on it
        (default: since it started here)."""
        run = self.running.pop(request_id, None)
        if run is None:
            self.dequeue(request_id)
            return
        if now_s is not None and run.predicted_s > 0:
            if took_s is None:
                took_s = now_s - run.started_s
            took_s = min(MAX_PACE * run.predicted_s, max(0.0, took_s))
            self.paced_measured_s = PACE_DECAY * self.paced_measured_s + took_s
            self.paced_predicted_s = PACE_DECAY * self.paced_predicted_s + run.predicted_s

    def request_ids(self) -> list[str]:
        return [*self.queued_s, *self.running]


@dataclass(slots=True)
class DecodingRequest:
    """A request in the batch. `expected_s` and `expected_tokens` are early-predicted's
    forecast of its decode, made when it was booked."""

    context_tokens: int  # grows with the tokens it generates (DecodeStep)
    started_s: float
    expected_s: float = math.inf
    expected_tokens: int = 0
    prompt_tokens: int = 0

    @property
    def expected_end_s(self) -> float:
        return self.started_s + self.expected_s

    def context_at(self, at_s: float) -> float:
        """The KV it will hold at `at_s`: what it holds now, or its prompt plus the tokens
        its forecast pace has generated by then, whichever is more."""
        if not self.expected_tokens or not math.isfinite(self.expected_s):
            return self.context_tokens
        done = min(1.0, max(0.0, at_s - self.started_s) / self.expected_s)
        return max(self.context_tokens, self.prompt_tokens + self.expected_tokens * done)


@dataclass(slots=True)
class IncomingRequest:
    """A request assigned to a decode instance whose prefill has not finished yet."""

    context_tokens: int
    ready_s: float
    expected_s: float = math.inf
    expected_tokens: int = 0

    def context_at(self, at_s: float) -> float:
        """Its prompt plus the tokens generated from `ready_s` to `at_s` at its forecast pace."""
        if not self.expected_tokens or not math.isfinite(self.expected_s):
            return self.context_tokens
        done = min(1.0, max(0.0, at_s - self.ready_s) / self.expected_s)
        return self.context_tokens + self.expected_tokens * done


@dataclass(slots=True)
class DecodeState:
    """One decode instance: its running batch and the requests headed its way."""

    instance_id: str
    kv_capacity_tokens: int | None = None
    decoding: dict[str, DecodingRequest] = field(default_factory=dict)
    decoding_context_tokens: int = 0
    incoming: dict[str, IncomingRequest] = field(default_factory=dict)
    incoming_context_tokens: int = 0
    draining: bool = False  # takes no new requests

    def add_incoming(
        self,
        request_id: str,
        context_tokens: int,
        ready_s: float,
        expected_s: float = math.inf,
        expected_tokens: int = 0,
    ) -> None:
        self.incoming[request_id] = IncomingRequest(
            context_tokens, ready_s, expected_s, expected_tokens
        )
        self.incoming_context_tokens += context_tokens

    def drop_incoming(self, request_id: str) -> IncomingRequest | None:
        incoming = self.incoming.pop(request_id, None)
        if incoming is not None:
            self.incoming_context_tokens -= incoming.context_tokens
        return incoming

    def start(self, request_id: str, context_tokens: int, now_s: float) -> None:
        """The request joined the batch; it keeps the forecast it was booked with."""
        incoming = self.drop_incoming(request_id)
        expected_s, expected_tokens = (
            (incoming.expected_s, incoming.expected_tokens) if incoming else (math.inf, 0)
        )
        self.decoding[request_id] = DecodingRequest(
            context_tokens, now_s, expected_s, expected_tokens, prompt_tokens=context_tokens
        )
        self.decoding_context_tokens += context_tokens

    def grow(self, request_id: str, context_tokens: int) -> None:
        running = self.decoding.get(request_id)
        if running is not None and context_tokens > running.context_tokens:
            self.decoding_context_tokens += context_tokens - running.context_tokens
            running.context_tokens = context_tokens

    def finish(self, request_id: str) -> DecodingRequest | None:
        running = self.decoding.pop(request_id, None)
        if running is not None:
            self.decoding_context_tokens -= running.context_tokens
        else:
            self.drop_incoming(request_id)
        return running

    def request_ids(self) -> list[str]:
        return [*self.incoming, *self.decoding]
