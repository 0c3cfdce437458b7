"""EffectExecutor: carries out the core's effects in memory and ends requests, exactly once.

It owns the request table (requests in flight, and the newest finished ones for readers)
and the request log: arrivals, decisions and outcomes are queued under the lock, in the
core's order, and written behind in batches by `backend.db.writer.RequestLogWriter`.
Whatever must block (a dispatch to an agent, an eviction call) is handed to the runner or
returned as work to do after the lock.
"""

import dataclasses
import logging
from collections import deque
from collections.abc import Callable, Sequence

from backend.db.records import RequestOutcome
from backend.db.writer import RecordNotAccepted, RequestLogWriter
from backend.observe.measures import gap_histogram
from backend.policy import events as ev
from backend.policy.effects import (
    DispatchDecode,
    DispatchPrefill,
    Effect,
    EffectHandler,
    Evict,
    FailRequest,
    Reject,
    Replicate,
    carry_out,
)
from backend.runtime.hotspots import BlockHits
from backend.runtime.requests import RequestStream, gap_summary
from backend.runtime.state import AfterWork, AgentInfo, RuntimeState, run_after

logger = logging.getLogger(__name__)


class RequestLogUnavailable(RuntimeError):
    """The request log cannot take a new request (its writer is stopped or far behind a
    failing database): the request is refused before admission, so none goes unrecorded."""


class EffectExecutor(EffectHandler):
    """The in-memory side of every effect, and each request's single terminal outcome."""

    def __init__(
        self,
        state: RuntimeState,
        log: RequestLogWriter | None,
        *,
        max_finished_requests: int,
    ) -> None:
        self._state = state
        self.log = log
        self.hits = BlockHits()
        self.open: dict[str, float] = {}  # unfinished request id -> arrival, oldest first
        # Finished requests stay readable until this many newer ones finished.
        self._finished: deque[str] = deque()
        self.max_finished_requests = max_finished_requests
        self._work: AfterWork = []
        # Set by the runtime once the runner exists: start a dispatched request on its
        # agents; send an eviction to an agent (both return at once).
        self.launch: Callable[[DispatchPrefill, bool], None] = _not_wired
        self.send_evict: Callable[[AgentInfo, Evict], None] = _not_wired

    # -- feeding the core ----------------------------------------------------------------------
    def apply(self, effects: Sequence[Effect]) -> AfterWork:
        """Carry out effects in memory (lock held); returns the work to do after the lock."""
        self._work = []
        carry_out(self, effects)
        work, self._work = self._work, []
        return work

    def feed(self, event: ev.Event) -> tuple[Effect, ...]:
        """Hand one event to the core and carry out its effects (takes the lock)."""
        with self._state.lock:
            effects = self._state.core.handle(event)
            after = self.apply(effects)
        run_after(after)
        return effects

    def admit(
        self, stream: RequestStream, arrival: ev.RequestArrived, **log_fields: object
    ) -> None:
        """Record the arrival, then let the core decide (takes the lock).
        RequestLogUnavailable when the request log cannot take it."""
        state = self._state
        with state.lock:
            if stream.request_id in state.requests:
                raise ValueError(f"request {stream.request_id!r} was already submitted")
            if self.log is not None:
                try:
                    self.log.record_arrival(arrival=arrival, **log_fields)
                except RecordNotAccepted as error:
                    raise RequestLogUnavailable(str(error)) from None
            state.requests[stream.request_id] = stream
            self.open[stream.request_id] = arrival.now_s
            after = self.apply(state.core.handle(arrival))
        run_after(after)

    # -- the effects (EffectHandler; lock held, blocking work queued in _work) -----------------
    def on_dispatch_prefill(self, effect: DispatchPrefill, *, replicate: bool) -> None:
        state = self._state
        stream = state.requests[effect.request_id]
        stream.dispatch = effect
        stream.decisions.append(effect)
        num_reused_blocks = effect.plan.num_reused_tokens // state.config.block_size
        self.hits.record(stream.block_keys, num_reused_blocks)
        self.log_record("decision", decision=effect, now_s=state.clock())
        if state.metrics is not None:
            self._work.append(lambda m=state.metrics, e=effect: m.record_decision(e))
        self.launch(effect, replicate)

    def on_replicate(self, effect: Replicate) -> None:
        # It rides on its DispatchPrefill (replicate=True): the agent keeps what it fetched.
        if self._state.metrics is not None:
            self._work.append(lambda m=self._state.metrics, e=effect: m.record_replication(e))

    def on_dispatch_decode(self, effect: DispatchDecode) -> None:
        """Carried out by the request's runner task, which fed the PrefillFinished."""

    def on_reject(self, effect: Reject) -> None:
        outcome = self.outcome("rejected", effect.reason, effect.stage, effect.message)
        self._state.requests[effect.request_id].retry_after_s = effect.retry_after_s
        self._work.extend(self.end(effect.request_id, outcome))

    def on_fail(self, effect: FailRequest) -> None:
        stage = self._state.requests[effect.request_id].stage
        outcome = self.outcome("failed", effect.reason, stage)
        self._work.extend(self.end(effect.request_id, outcome))

    def on_evict(self, effect: Evict) -> None:
        info = self._state.agents.get(effect.instance_id)
        if info is not None:
            self._work.append(lambda i=info, e=effect: self.send_evict(i, e))

    # -- ending requests -----------------------------------------------------------------------
    def outcome(
        self, state: str, reason: str | None, stage: str | None = None, message: str | None = None
    ) -> RequestOutcome:
        return RequestOutcome(
            state,  # type: ignore[arg-type]
            self._state.clock(),
            reason=reason,
            stage=stage,
            message=message,
        )

    def end(self, request_id: str, outcome: RequestOutcome) -> AfterWork:
        """Set the single terminal outcome (lock held); a second one is ignored."""
        stream = self._state.requests.get(request_id)
        if stream is None or stream.outcome is not None:
            return []
        gaps = stream.tbt_gaps_s()
        tbt = gap_summary(gaps)
        stream.outcome = dataclasses.replace(
            outcome,
            tbt_gap_histogram=gap_histogram(gaps) if gaps else None,
            num_generated_tokens=len(stream.tokens),
            num_reused_tokens=stream.num_reused_tokens,
            num_transferred_tokens=stream.num_fetched_tokens,
            tbt_mean_s=tbt[0] if tbt else None,
            tbt_p99_s=tbt[1] if tbt else None,
            tbt_max_s=tbt[2] if tbt else None,
        )
        stream.dispatch = None
        self.open.pop(request_id, None)
        # Kept for the newest max_finished_requests finished requests: only what callers read
        # (outcome, generated tokens, decisions), not the prompt (160 KiB at 4,000 tokens).
        stream.token_ids, stream.block_keys = (), ()
        stream.token_times_s, stream.token_produced_s = [], []
        self.log_record("outcome", request_id=request_id, outcome=stream.outcome)
        self._finished.append(request_id)
        while len(self._finished) > self.max_finished_requests:
            self._state.requests.pop(self._finished.popleft(), None)
        return [stream.close]

    def fail(self, stream: RequestStream, reason: str, stage: str) -> None:
        """End a request as failed and drop it from the core's books (takes the lock)."""
        state = self._state
        with state.lock:
            if stream.outcome is not None:
                return
            state.core.handle(ev.RequestFailed(state.clock(), stream.request_id, reason))
            after = self.end(stream.request_id, self.outcome("failed", reason, stage))
        run_after(after)

    def log_record(self, kind: str, **record: object) -> None:
        """Queue a decision or an outcome for the request log (lock held; never waits)."""
        if self.log is None:
            return
        try:
            getattr(self.log, f"record_{kind}")(**record)
        except RecordNotAccepted as error:  # the database has been failing for long
            logger.error("request log: a %s was not recorded: %s", kind, error)


def _not_wired(*_: object) -> None:
    raise AssertionError("the executor is used before the runtime wired its runner")
