"""The gRPC side of an agent: the Agent servicer over a NodeAgent.

Only conversion and status codes live here; backend.rpc.convert turns the messages that
carry policy types (plans, KV events) into dataclasses.
"""

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import grpc

from agents.node.node import NodeAgent, PlanError

if TYPE_CHECKING:
    from agents.node.metrics import AgentMetrics
from agents.workers import DecodeOutcome, SamplingParams, TokenLogprob
from backend.rpc import agent_pb2 as pb
from backend.rpc import agent_pb2_grpc as pb_grpc
from backend.rpc.convert import (
    arrival_check_from_proto,
    cache_plan_from_proto,
    kv_events_to_proto,
    load_to_proto,
    role_from_proto,
    role_to_proto,
)


def _abort(context: grpc.ServicerContext, error: PlanError) -> None:
    context.abort(getattr(grpc.StatusCode, error.code), str(error))


def _cancel_if_abandoned(context: Any, agent: NodeAgent, request_id: str) -> list[bool]:
    """Cancel the request here if its call ends before it did (the Conductor cancelled the
    call, or died: its connection closing ends the call too); set the flag's element once
    the call has answered, so a normal end cancels nothing."""
    answered = [False]

    def on_call_end() -> None:
        if not answered[0]:
            agent.cancel(request_id, "call_cancelled")

    context.add_callback(on_call_end)
    return answered


def _sampling(message: pb.Sampling) -> SamplingParams:
    return SamplingParams(
        message.temperature,
        message.top_k,
        message.seed,
        message.ignore_eos,
        logprobs=message.logprobs,
        top_logprobs=message.top_logprobs,
    )


def _alternatives(logprob: TokenLogprob) -> list[Any]:
    return [pb.TokenLogprob(token=token, logprob=value) for token, value in logprob.top]


class AgentService(pb_grpc.AgentServicer):
    def __init__(
        self, agent: NodeAgent, control_address: str, metrics: "AgentMetrics | None" = None
    ) -> None:
        self.agent = agent
        self.control_address = control_address
        self.metrics = metrics
        # Called before answering a call that made KV events: the heartbeat channel carries
        # them to the Conductor first (the answers carry them too, for a driver without one).
        self.flush_events: Callable[[], None] = lambda: None

    def DispatchPrefill(self, request: pb.DispatchPrefillRequest, context: Any) -> Any:
        plan, fetch_address = cache_plan_from_proto(request.plan)
        answered = _cancel_if_abandoned(context, self.agent, request.request_id)
        try:
            outcome = self.agent.prefill(
                request.request_id,
                list(request.token_ids),
                plan,
                fetch_address,
                replicate=request.replicate,
                decode_address=request.decode_data_address,
                sampling=_sampling(request.sampling),
                return_logits=request.return_logits,
                line_position=request.line_position,
            )
        except PlanError as error:
            _abort(context, error)
        except ValueError as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        finally:
            answered[0] = True
        self.flush_events()
        if self.metrics is not None:
            self.metrics.observe_prefill(outcome)
            tokens_per_block = self.agent.block_size
            block_bytes = self.agent.shard.block_bytes
            fetched_bytes = outcome.num_fetched_tokens // tokens_per_block * block_bytes
            self.metrics.record_transport_bytes("fetched", fetched_bytes)
        first = outcome.first_logprob
        return pb.DispatchPrefillReply(
            request_id=outcome.request_id,
            instance_id=self.agent.instance_id,
            first_token=outcome.first_token,
            num_tokens=outcome.num_tokens,
            num_reused_tokens=outcome.num_reused_tokens,
            num_fetched_tokens=outcome.num_fetched_tokens,
            recomputed_keys=outcome.recomputed_keys,
            stored_keys=outcome.stored_keys,
            timings=pb.PrefillTimings(**outcome.timings),
            events=kv_events_to_proto(outcome.events),
            handed_off=outcome.handed_off,
            logits=outcome.logits.tolist() if outcome.logits is not None else (),
            first_logprob=first.logprob if first is not None else None,
            first_top_logprobs=_alternatives(first) if first is not None else (),
        )

    def DispatchDecode(self, request: pb.DispatchDecodeRequest, context: Any) -> Iterator[Any]:
        try:
            decides, check = arrival_check_from_proto(request)
        except ValueError as bad:
            _abort(context, PlanError("INVALID_ARGUMENT", str(bad)))
        try:
            stream = self.agent.start_decode(
                request.request_id,
                request.num_context_tokens,
                request.first_token,
                request.max_tokens,
                _sampling(request.sampling),
                check,
                dispatch_decides=decides,
            )
        except PlanError as error:
            _abort(context, error)
        answered = _cancel_if_abandoned(context, self.agent, request.request_id)
        started_s = time.monotonic()
        try:
            index = 0
            while True:
                item = stream.get()
                if isinstance(item, DecodeOutcome):
                    answered[0] = True
                    if self.metrics is not None and item.status == "completed":
                        self.metrics.observe_decode(time.monotonic() - started_s, index)
                    yield pb.DecodeMessage(
                        request_id=request.request_id,
                        done=True,
                        status=item.status,
                        reason=item.reason or "",
                        stage=item.stage or "",
                    )
                    return
                token, logprob, produced_s = item
                message = pb.DecodeMessage(
                    request_id=request.request_id, token=token, index=index, produced_s=produced_s
                )
                if logprob is not None:
                    message.logprob = logprob.logprob
                    message.top_logprobs.extend(_alternatives(logprob))
                yield message
                index += 1
        finally:
            self.agent.finish_decode()

    def ReplicateBlocks(self, request: pb.ReplicateBlocksRequest, context: Any) -> Any:
        try:
            stored, failed, error, events = self.agent.replicate(
                request.source_data_address, list(request.keys), request.first_depth
            )
        except PlanError as plan_error:
            _abort(context, plan_error)
        self.flush_events()
        return pb.ReplicateBlocksReply(
            stored_keys=stored, failed_keys=failed, error=error, events=kv_events_to_proto(events)
        )

    def EvictBlocks(self, request: pb.EvictBlocksRequest, context: Any) -> Any:
        events = self.agent.evict(request.keys)
        self.flush_events()
        return pb.EvictBlocksReply(events=kv_events_to_proto(events))

    def SetRole(self, request: pb.SetRoleRequest, context: Any) -> Any:
        try:
            role = self.agent.set_role(role_from_proto(request.role))
        except ValueError as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except PlanError as error:
            _abort(context, error)
        return pb.SetRoleReply(role=role_to_proto(role))

    def Drain(self, request: pb.DrainRequest, context: Any) -> Any:
        drained, num_in_flight = self.agent.drain(request.timeout_s or None)
        return pb.DrainReply(drained=drained, num_in_flight=num_in_flight)

    def Cancel(self, request: pb.CancelRequest, context: Any) -> Any:
        if not request.request_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a request id is required")
        dropped = self.agent.cancel(request.request_id, request.reason or "cancelled")
        return pb.CancelReply(dropped_from=dropped)

    def GetState(self, request: pb.GetStateRequest, context: Any) -> Any:
        agent, settings = self.agent, self.agent.settings
        prefill, decode, memory = load_to_proto(agent.report_load())
        return pb.AgentState(
            instance_id=agent.instance_id,
            role=role_to_proto(agent.role),
            control_address=self.control_address,
            data_address=agent.data_address,
            transport=settings.transport,
            preset=settings.preset,
            block_size=agent.block_size,
            draining=agent.draining,
            now_s=time.time(),
            prefill=prefill,
            decode=decode,
            memory=memory,
            events=kv_events_to_proto(agent.take_events()) if request.take_events else (),
        )
