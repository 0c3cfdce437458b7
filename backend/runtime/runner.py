"""RequestRunner: each dispatched request's life on the agents, asynchronous end to end.

One event loop, on a thread of its own, runs a task per request in flight: the prefill
call, then the decode stream, token by token. No thread is held per request, so the number
in flight is bounded only by admission's explicit `max_in_flight_requests`. Every agent
call has a deadline (the request's own, `request_deadline_s` after its arrival, plus a
grace: the Conductor's deadline watch normally cancels first).

Failures are charged to the side that failed: an agent that does not answer (UNAVAILABLE)
is taken out, which re-routes what it had not started; a prefill whose KV hand-off to its
decode agent failed is placed again once, and only the decode agent is checked; anything
else fails that request alone.

An agent prefills one request at a time, in the order they reach it: a request dispatched
to it waits in its *line* and starts, in the core's view, when the one before it there ends
(as a twin prefill instance starts its next job). Fed at dispatch instead, every request
would seem to run at once and the core's T_queue would miss the agent's backlog.
"""

import asyncio
import contextlib
import dataclasses
import logging
import math
import threading
from collections.abc import Callable, Sequence
from concurrent import futures

import grpc
import grpc.aio

from backend.policy import events as ev
from backend.policy.calibration import Calibrator, ServingSample
from backend.policy.effects import DispatchDecode, DispatchPrefill, Effect, Evict
from backend.policy.lines import PrefillLines
from backend.rpc import agent_pb2 as pb
from backend.rpc import agent_pb2_grpc as pb_grpc
from backend.rpc.convert import (
    dispatch_decode_to_proto,
    dispatch_prefill_to_proto,
    evict_to_proto,
)
from backend.runtime.executor import EffectExecutor
from backend.runtime.requests import Logprob, RequestStream, Sampling
from backend.runtime.state import AgentInfo, RuntimeState, run_after

logger = logging.getLogger(__name__)

# Beyond a request's own deadline, how long its agent calls may still run: the deadline
# watch cancels overdue requests first; this only bounds a call the watch missed.
DEADLINE_GRACE_S = 5.0


class _TaskCall:
    """A request's runner task, as the `AgentCall` a cancel from any thread reaches."""

    def __init__(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task) -> None:
        self._loop, self._task = loop, task

    def cancel(self) -> bool:
        if self._loop.is_closed():
            return False
        self._loop.call_soon_threadsafe(self._task.cancel)
        return True


class RequestRunner:
    """Runs dispatched requests on the agents; see the module doc."""

    def __init__(
        self,
        state: RuntimeState,
        executor: EffectExecutor,
        calibrator: Calibrator,
        *,
        metadata: tuple[tuple[str, str], ...],
        request_deadline_s: float,
        leave: Callable[[str, str], None],
        cancel: Callable[[str, str], object],
    ) -> None:
        self._state = state
        self._executor = executor
        self._calibrator = calibrator
        self._metadata = metadata
        self.request_deadline_s = request_deadline_s
        self._leave = leave  # AgentRegistry.leave: blocking, so called off the loop
        self._cancel = cancel  # ConductorRuntime.cancel: ends a request its agent dropped
        self._lines = PrefillLines()  # under the state's lock
        # Each line's last position handed out: the agent runs its waiting prefills in it.
        self._line_positions: dict[str, int] = {}
        # The loop's own: one channel per agent, made and closed on the loop.
        self._channels: dict[str, tuple[str, grpc.aio.Channel, pb_grpc.AgentStub]] = {}
        self._tasks: set[asyncio.Task] = set()
        # Cancel and evict calls, off the caller's thread (the API's event loop cancels).
        self._control = futures.ThreadPoolExecutor(2, thread_name_prefix="agent-control")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="request-runner", daemon=True
        )
        self._thread.start()

    # -- life ------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Cancel every task, close the channels and end the loop."""
        if self._loop.is_closed():
            return
        self._control.shutdown(wait=False, cancel_futures=True)
        future = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        try:
            future.result(timeout=5)
        except (futures.TimeoutError, RuntimeError):
            logger.warning("request runner: did not shut down in 5 s")
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()

    async def _shutdown(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for _, channel, _ in self._channels.values():
            await channel.close()
        self._channels.clear()

    @property
    def num_tasks(self) -> int:
        """Requests with a task on the loop now."""
        return len(self._tasks)

    # -- what the other parts call ---------------------------------------------------------------
    def launch(self, effect: DispatchPrefill, replicate: bool) -> None:
        """Start running a dispatched request (returns at once; any thread)."""
        self._loop.call_soon_threadsafe(self._start, effect, replicate)

    def forget(self, instance_id: str) -> None:
        """An agent left: drop its prefill line and close the runner's channel to it."""
        with self._state.lock:
            self._lines.forget(instance_id)
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._close_channel, instance_id)

    def drop_on_agents(
        self, request_id: str, reason: str, holders: Sequence[AgentInfo], call: object | None
    ) -> None:
        """Stop the request's task and have every agent that may hold it drop it."""
        if call is not None:
            call.cancel()  # type: ignore[attr-defined]
        for agent in holders:
            self._submit_control(self._cancel_on, agent, request_id, reason)

    def send_evict(self, agent: AgentInfo, effect: Evict) -> None:
        self._submit_control(self._evict, agent, effect)

    def _submit_control(self, call: Callable[..., None], *args: object) -> None:
        with contextlib.suppress(RuntimeError):  # stopping
            self._control.submit(call, *args)

    def _cancel_on(self, agent: AgentInfo, request_id: str, reason: str) -> None:
        try:
            agent.stub.Cancel(
                pb.CancelRequest(request_id=request_id, reason=reason),
                metadata=self._metadata,
                timeout=5,
            )
        except grpc.RpcError as error:  # a dead agent drops its work anyway
            logger.warning(
                "cancel of %s on %s failed: %s", request_id, agent.join.instance_id, error
            )

    def _evict(self, agent: AgentInfo, effect: Evict) -> None:
        # Its KV events reach the core on the heartbeat channel (the agent flushes them before
        # answering); the copy in the answer is for drivers without heartbeats.
        try:
            agent.stub.EvictBlocks(evict_to_proto(effect), metadata=self._metadata, timeout=10)
        except grpc.RpcError as error:
            logger.warning("evict on %s failed: %s", effect.instance_id, error)

    # -- on the loop -----------------------------------------------------------------------------
    def _start(self, effect: DispatchPrefill, replicate: bool) -> None:
        task = self._loop.create_task(self._run(effect, replicate))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _stub(self, agent: AgentInfo) -> pb_grpc.AgentStub:
        instance_id, address = agent.join.instance_id, agent.join.control_address
        known = self._channels.get(instance_id)
        if known is not None and known[0] == address:
            return known[2]
        self._close_channel(instance_id)
        channel = grpc.aio.insecure_channel(address)
        stub = pb_grpc.AgentStub(channel)
        self._channels[instance_id] = (address, channel, stub)
        return stub

    def _close_channel(self, instance_id: str) -> None:
        known = self._channels.pop(instance_id, None)
        if known is not None:
            self._loop.create_task(known[1].close())

    def _timeout_s(self, stream: RequestStream) -> float:
        left_s = stream.arrival_s + self.request_deadline_s - self._state.clock()
        return max(0.0, left_s) + DEADLINE_GRACE_S

    async def _run(self, effect: DispatchPrefill, replicate: bool) -> None:
        stream = self._state.requests.get(effect.request_id)
        if stream is None:
            return
        try:
            await self._run_prefill(stream, effect, replicate)
        except asyncio.CancelledError:
            return  # cancelled: the request has its outcome already (or the runner stops)
        except Exception as error:  # never lose a request to a bug in this task
            logger.exception("request %s failed", effect.request_id)
            self._executor.fail(stream, f"runtime error: {error}", "prefill")

    async def _run_prefill(
        self, stream: RequestStream, effect: DispatchPrefill, replicate: bool
    ) -> None:
        state = self._state
        with state.lock:
            if stream.dispatch is not effect:
                return  # re-routed or ended meanwhile
            prefill = state.agents.get(effect.instance_id)
            if prefill is None:
                return  # its AgentLeft re-routes or fails it
            addresses = {i: a.join.data_address for i, a in state.agents.items()}
            prefill_id = effect.instance_id
            stream.call = _TaskCall(self._loop, asyncio.current_task())  # type: ignore[arg-type]
            after = self._executor.apply(self._join_line(prefill_id, stream.request_id))
            position = self._line_positions[prefill_id] = (
                self._line_positions.get(prefill_id, 0) + 1
            )
        run_after(after)
        request = dispatch_prefill_to_proto(
            effect, stream.token_ids, addresses, replicate=replicate, line_position=position
        )
        request.sampling.CopyFrom(_sampling_to_proto(stream.sampling))
        try:
            reply = await self._stub(prefill).DispatchPrefill(
                request, metadata=self._metadata, timeout=self._timeout_s(stream)
            )
        except (grpc.RpcError, asyncio.CancelledError) as error:
            with state.lock:
                after = self._executor.apply(self._leave_line(prefill_id, stream.request_id))
            run_after(after)
            if isinstance(error, asyncio.CancelledError):
                raise
            await self._on_rpc_error(stream, prefill_id, error, "prefill", effect)
            return
        stream.prefill_answered_s = state.clock()
        stream.prefill_agent_s = reply.timings.total_s
        stream.prefill_answer_s = _answer_s(reply.timings, prefill, stream.prefill_answered_s)
        stream.num_reused_tokens = reply.num_reused_tokens
        stream.num_fetched_tokens = reply.num_fetched_tokens
        if reply.HasField("first_logprob"):
            stream.first_logprob = _logprob(reply.first_logprob, reply.first_top_logprobs)
        effects: tuple[Effect, ...] = ()
        with state.lock:
            if stream.dispatch is not effect:
                after = self._executor.apply(self._leave_line(prefill_id, stream.request_id))
            else:
                self._measured_fetch(effect, reply)
                # The pace learns from the agent's own measure of its work, as the twin's
                # from its prefill's: the calls to and from it are not the instance's pace.
                worked_s = reply.timings.total_s - reply.timings.queue_s
                effects = state.core.handle(
                    ev.PrefillFinished(
                        state.clock(), stream.request_id, prefill_id, worked_s or None
                    )
                )
                stream.stage = "decode"
                after = self._executor.apply(
                    (*effects, *self._leave_line(prefill_id, stream.request_id))
                )
        run_after(after)
        for decode in effects:
            if isinstance(decode, DispatchDecode) and decode.request_id == stream.request_id:
                await self._run_decode(stream, decode, reply.first_token)

    def _measured_fetch(self, effect: DispatchPrefill, reply: pb.DispatchPrefillReply) -> None:
        """Tell the core how fast the fetch the plan asked for went (under the lock): its
        per-link bandwidth estimates steer later transfers (backend.policy.links)."""
        fetch = effect.plan.fetch
        if fetch is None or reply.num_fetched_tokens <= 0:
            return
        core = self._state.core
        num_bytes = reply.num_fetched_tokens * core.cost.kv_bytes_per_token
        core.handle(
            ev.TransferMeasured(
                self._state.clock(),
                fetch.source_instance_id,
                effect.instance_id,
                num_bytes,
                reply.timings.fetch_s,
            )
        )

    def _join_line(self, instance_id: str, request_id: str) -> tuple[Effect, ...]:
        """Queue a dispatched request at its prefill agent; it starts at once if first.
        Under the lock."""
        if not self._lines.join(instance_id, request_id):
            return ()
        return self._state.core.handle(
            ev.PrefillStarted(self._state.clock(), request_id, instance_id)
        )

    def _leave_line(self, instance_id: str, request_id: str) -> tuple[Effect, ...]:
        """The request's prefill ended (answered or failed): the next live one in its agent's
        line starts. Under the lock."""
        requests = self._state.requests

        def is_waiting(waiting_id: str) -> bool:  # not ended or re-routed meanwhile
            head = requests.get(waiting_id)
            dispatch = head.dispatch if head is not None else None
            return (
                head is not None
                and not head.is_finished
                and dispatch is not None
                and dispatch.instance_id == instance_id
            )

        starts = self._lines.leave(instance_id, request_id, is_waiting)
        if starts is None:
            return ()
        return self._state.core.handle(ev.PrefillStarted(self._state.clock(), starts, instance_id))

    async def _run_decode(
        self, stream: RequestStream, effect: DispatchDecode, first_token: int
    ) -> None:
        state = self._state
        with state.lock:
            agent = state.agents.get(effect.instance_id)
        if agent is None:
            self._executor.fail(stream, f"decode instance {effect.instance_id} is gone", "decode")
            return
        request = dispatch_decode_to_proto(
            effect, first_token=first_token, max_tokens=stream.max_tokens
        )
        request.sampling.CopyFrom(_sampling_to_proto(stream.sampling))
        stream.decode_instance_id = effect.instance_id
        started = False
        call = self._stub(agent).DispatchDecode(
            request, metadata=self._metadata, timeout=self._timeout_s(stream)
        )
        try:
            async for message in call:
                if stream.is_finished:
                    call.cancel()
                    return  # ended meanwhile (its decode agent left, a cancel)
                if message.done:
                    self._on_decode_done(stream, effect, message)
                    return
                if not started:
                    started = True
                    self._executor.feed(
                        ev.DecodeStarted(state.clock(), stream.request_id, effect.instance_id)
                    )
                stream.push_token(
                    message.token,
                    state.clock(),
                    _message_logprob(stream, message),
                    produced_s=message.produced_s,
                )
                self._executor.feed(
                    ev.DecodeStep(state.clock(), stream.request_id, len(stream.tokens))
                )
        except grpc.RpcError as error:
            await self._on_rpc_error(stream, effect.instance_id, error, "decode")
            return
        self._executor.fail(stream, "decode stream ended without a terminal message", "decode")

    def _on_decode_done(
        self, stream: RequestStream, effect: DispatchDecode, message: pb.DecodeMessage
    ) -> None:
        state, executor = self._state, self._executor
        now_s = state.clock()
        serving = None
        if message.status == "cancelled":  # the agent dropped it (a cancel from elsewhere)
            self._cancel(stream.request_id, message.reason or "cancelled_by_agent")
            return
        if message.status == "rejected":
            reason = message.reason or "decode_rejected"
            event: ev.Event = ev.DecodeRejected(
                now_s, stream.request_id, effect.instance_id, reason
            )
            outcome = executor.outcome("rejected", reason, message.stage or "decode")
        else:
            event = ev.DecodeFinished(now_s, stream.request_id, len(stream.tokens))
            # TTFT (backend/observe/measures.py): arrival to the first token leaving the Conductor.
            first_s = stream.token_times_s[0] if stream.token_times_s else now_s
            outcome = dataclasses.replace(
                executor.outcome("completed", None), ttft_s=first_s - stream.arrival_s
            )
            serving = _serving_sample(stream, first_s, now_s)
        with state.lock:
            after = executor.apply(state.core.handle(event))
            after.extend(executor.end(stream.request_id, outcome))
            if serving is not None:
                self._calibrator.add_serving((serving,))
        run_after(after)

    async def _on_rpc_error(
        self,
        stream: RequestStream,
        instance_id: str,
        error: grpc.RpcError,
        stage: str,
        effect: DispatchPrefill | None = None,
    ) -> None:
        """An unreachable agent is dead (AgentLeft fails its in-flight requests, this one
        included); a prefill whose KV hand-off failed (ABORTED: that prefill agent is fine)
        is placed again once, after its decode agent is taken out if it no longer answers;
        any other error fails just this request."""
        code = error.code()  # type: ignore[attr-defined]
        details = error.details() or ""  # type: ignore[attr-defined]
        if code == grpc.StatusCode.UNAVAILABLE:
            await asyncio.to_thread(self._leave, instance_id, f"unreachable ({details})")
        handoff = code == grpc.StatusCode.ABORTED and "hand-off" in details
        if (
            handoff
            and effect is not None
            and await self._retry_after_handoff(stream, effect, details)
        ):
            return
        self._executor.fail(
            stream, f"{stage} on {instance_id} failed: {code.name} {details}"[:500], stage
        )

    async def _retry_after_handoff(
        self, stream: RequestStream, effect: DispatchPrefill, details: str
    ) -> bool:
        """The KV of `stream`'s prefill could not reach its decode agent: take that agent out
        if it does not answer (it died and nobody noticed yet), then place the request again
        (its prefix is cached now, so the second prefill costs little). False when it was
        placed again once already."""
        if stream.num_retries >= 1:
            return False
        state = self._state
        decode_id = effect.decode_instance_id
        with state.lock:
            decode = state.agents.get(decode_id)
        if decode is not None and not await self._answers(decode):
            reason = f"unreachable (a KV hand-off to it failed: {details})"[:500]
            await asyncio.to_thread(self._leave, decode_id, reason)
        with state.lock:
            if stream.is_finished:
                return True  # ended meanwhile (e.g. cancelled): nothing to retry
            stream.num_retries += 1
            stream.stage, stream.dispatch = "prefill", None
            now_s = state.clock()
            effects = state.core.handle(ev.RequestRetried(now_s, stream.request_id, details[:200]))
            if not effects:  # the core had forgotten it: fail it rather than leave it open
                return False
            after = self._executor.apply(effects)
        logger.warning("request %s placed again: %s", stream.request_id, details)
        run_after(after)
        return True

    async def _answers(self, agent: AgentInfo) -> bool:
        try:
            await self._stub(agent).GetState(
                pb.GetStateRequest(), metadata=self._metadata, timeout=1.0
            )
        except grpc.RpcError:
            return False
        return True


def _answer_s(timings: pb.PrefillTimings, agent: AgentInfo, answered_s: float) -> float | None:
    """The prefill agent's answer on its way back: our clock on receipt minus the agent's
    stamp as its work on the prefill ended, in our clock (its heartbeats' offset); None
    where it does not stamp or has not sent a heartbeat yet."""
    if timings.ended_unix_s <= 0 or not math.isfinite(agent.clock_offset_s):
        return None
    return max(0.0, answered_s - (timings.ended_unix_s + agent.clock_offset_s))


def _serving_sample(stream: RequestStream, first_s: float, now_s: float) -> ServingSample | None:
    """What the serving path cost this completed request, beyond the agents' own work:
    both ways to and from its prefill agent (split where the agent stamped its answer) and
    the first token's way out."""
    if stream.prefill_answered_s is None:
        return None
    tbt = stream.tbt_s()
    both_ways_s = max(0.0, stream.prefill_answered_s - stream.arrival_s - stream.prefill_agent_s)
    answer_s = stream.prefill_answer_s
    if answer_s is not None:
        answer_s = min(answer_s, both_ways_s)
    return ServingSample(
        time_s=now_s,
        dispatch_s=both_ways_s - (answer_s or 0.0),
        first_token_s=max(0.0, first_s - stream.prefill_answered_s),
        tbt_mean_s=tbt[0] if tbt else None,
        num_gaps=max(0, len(stream.token_times_s) - 1),
        answer_s=answer_s,
    )


def _logprob(value: float, alternatives: Sequence[pb.TokenLogprob]) -> Logprob:
    return Logprob(value, tuple((a.token, a.logprob) for a in alternatives))


def _message_logprob(stream: RequestStream, message: pb.DecodeMessage) -> Logprob | None:
    """A streamed token's log-probability: the first token's came with the prefill's answer."""
    if message.index == 0:
        return stream.first_logprob
    if message.HasField("logprob"):
        return _logprob(message.logprob, message.top_logprobs)
    return None


def _sampling_to_proto(sampling: Sampling) -> pb.Sampling:
    seed = (sampling.seed + 2**63) % 2**64 - 2**63  # into int64, as agent.proto carries it
    return pb.Sampling(
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        seed=seed,
        ignore_eos=sampling.ignore_eos,
        logprobs=sampling.logprobs,
        top_logprobs=sampling.top_logprobs,
    )
