"""Proto messages <-> dataclasses (the policy's, and backend.rpc.reports' load, joins and
heartbeats): the one place the control plane converts.

The policy names instances by id; the wire also needs their data-plane addresses, so the
converters that build dispatches take a mapping from instance id to data address.
"""

from collections.abc import Iterable, Mapping, Sequence

from backend.policy.calibration import DecodeStepSample, HostCpuSample, PrefillSample
from backend.policy.cost_model import DecodeFit
from backend.policy.effects import (
    ArrivalCheck,
    CachePlan,
    DispatchDecode,
    DispatchPrefill,
    Evict,
    FetchSpan,
)
from backend.policy.effects import Replicate as ReplicateEffect
from backend.policy.events import KvDemoted, KvEvicted, KvStored, Role
from backend.policy.index import Tier
from backend.rpc import agent_pb2 as pb
from backend.rpc.reports import AgentLoad, Heartbeat, Join, KvEvent

_TIER_TO_PB = {Tier.DRAM: pb.DRAM, Tier.SSD: pb.SSD}
_TIER_FROM_PB = {value: key for key, value in _TIER_TO_PB.items()}
_ROLE_TO_PB: dict[str, int] = {"prefill": pb.PREFILL, "decode": pb.DECODE}
_ROLE_FROM_PB = {value: key for key, value in _ROLE_TO_PB.items()}


def role_to_proto(role: Role) -> int:
    return _ROLE_TO_PB[role]


def role_from_proto(role: int) -> Role:
    """The role a proto enum names; ValueError for ROLE_UNSPECIFIED or unknown values."""
    try:
        return _ROLE_FROM_PB[role]  # type: ignore[return-value]
    except KeyError:
        raise ValueError(f"role must be PREFILL or DECODE, got {role}") from None


# -- cache plans ---------------------------------------------------------------------------
def cache_plan_to_proto(plan: CachePlan, data_addresses: Mapping[str, str]) -> pb.CachePlan:
    """The plan on the wire; the fetch's source is resolved to its data address."""
    message = pb.CachePlan(
        local_keys=plan.local_keys,
        num_reused_tokens=plan.num_reused_tokens,
        num_compute_tokens=plan.num_compute_tokens,
    )
    if plan.fetch is not None and plan.fetch.keys:
        source = plan.fetch.source_instance_id
        message.fetch.CopyFrom(
            pb.FetchSpan(
                source_instance_id=source,
                source_data_address=data_addresses[source],
                keys=plan.fetch.keys,
            )
        )
    return message


def cache_plan_from_proto(message: pb.CachePlan) -> tuple[CachePlan, str | None]:
    """The policy's plan and the fetch source's data address (None without a fetch)."""
    fetch, address = None, None
    if message.HasField("fetch") and message.fetch.keys:
        fetch = FetchSpan(message.fetch.source_instance_id, tuple(message.fetch.keys))
        address = message.fetch.source_data_address
    plan = CachePlan(
        local_keys=tuple(message.local_keys),
        fetch=fetch,
        num_reused_tokens=message.num_reused_tokens,
        num_compute_tokens=message.num_compute_tokens,
    )
    return plan, address


# -- effects -> requests -------------------------------------------------------------------
def dispatch_prefill_to_proto(
    effect: DispatchPrefill,
    token_ids: Sequence[int],
    data_addresses: Mapping[str, str],
    *,
    replicate: bool = False,
    return_logits: bool = False,
    line_position: int = 0,
) -> pb.DispatchPrefillRequest:
    """The request for `effect.instance_id`; `replicate` when a Replicate effect came with it;
    `line_position`: its place in the Conductor's line for that agent (0: none)."""
    return pb.DispatchPrefillRequest(
        line_position=line_position,
        request_id=effect.request_id,
        token_ids=token_ids,
        plan=cache_plan_to_proto(effect.plan, data_addresses),
        replicate=replicate,
        decode_instance_id=effect.decode_instance_id,
        decode_data_address=data_addresses.get(effect.decode_instance_id, ""),
        return_logits=return_logits,
    )


def dispatch_decode_to_proto(
    effect: DispatchDecode, *, first_token: int, max_tokens: int
) -> pb.DispatchDecodeRequest:
    """The decode dispatch, with its arrival check always present (an empty one: no check),
    so the agent applies the Conductor's configuration, never its own."""
    check = effect.arrival_check
    return pb.DispatchDecodeRequest(
        request_id=effect.request_id,
        num_context_tokens=effect.num_context_tokens,
        first_token=first_token,
        max_tokens=max_tokens,
        arrival_check=pb.ArrivalCheck()
        if check is None
        else pb.ArrivalCheck(
            tbt_slo_s=check.tbt_slo_s,
            fixed_s=check.decode.fixed_s,
            per_request_s=check.decode.per_request_s,
            per_context_token_s=check.decode.per_context_token_s,
        ),
    )


def arrival_check_from_proto(message: pb.DispatchDecodeRequest) -> tuple[bool, ArrivalCheck | None]:
    """(whether the dispatch decides the check, the check or None); ValueError when bad."""
    if not message.HasField("arrival_check"):
        return False, None
    check = message.arrival_check
    if check.tbt_slo_s == 0:
        return True, None
    if not check.tbt_slo_s > 0:
        raise ValueError(f"the arrival check's TBT SLO must be positive, got {check.tbt_slo_s}")
    fit = DecodeFit(check.fixed_s, check.per_request_s, check.per_context_token_s)
    return True, ArrivalCheck(check.tbt_slo_s, fit)


def replicate_to_proto(
    effect: ReplicateEffect, data_addresses: Mapping[str, str], first_depth: int = 0
) -> pb.ReplicateBlocksRequest:
    return pb.ReplicateBlocksRequest(
        request_id=effect.request_id,
        source_instance_id=effect.source_instance_id,
        source_data_address=data_addresses[effect.source_instance_id],
        keys=effect.keys,
        first_depth=first_depth,
    )


def evict_to_proto(effect: Evict) -> pb.EvictBlocksRequest:
    return pb.EvictBlocksRequest(keys=effect.keys)


# -- KV events -----------------------------------------------------------------------------
def kv_event_to_proto(event: KvEvent) -> pb.KvEvent:
    keys = event.keys
    if isinstance(event, KvStored):
        return pb.KvEvent(
            kind=pb.KvEvent.STORED,
            now_s=event.now_s,
            instance_id=event.instance_id,
            keys=keys,
            tier=_TIER_TO_PB[event.tier],
        )
    kind = pb.KvEvent.EVICTED if isinstance(event, KvEvicted) else pb.KvEvent.DEMOTED
    return pb.KvEvent(kind=kind, now_s=event.now_s, instance_id=event.instance_id, keys=keys)


def kv_event_from_proto(message: pb.KvEvent) -> KvEvent:
    """The policy's event; ValueError for an unknown kind or tier."""
    keys = tuple(message.keys)
    if message.kind == pb.KvEvent.STORED:
        if message.tier not in _TIER_FROM_PB:
            raise ValueError(f"a stored event needs a tier, got {message.tier}")
        return KvStored(message.now_s, message.instance_id, keys, _TIER_FROM_PB[message.tier])
    if message.kind == pb.KvEvent.EVICTED:
        return KvEvicted(message.now_s, message.instance_id, keys)
    if message.kind == pb.KvEvent.DEMOTED:
        return KvDemoted(message.now_s, message.instance_id, keys)
    raise ValueError(f"unknown KV event kind {message.kind}")


def kv_events_to_proto(events: Iterable[KvEvent]) -> list[pb.KvEvent]:
    return [kv_event_to_proto(event) for event in events]


def kv_events_from_proto(messages: Iterable[pb.KvEvent]) -> list[KvEvent]:
    return [kv_event_from_proto(message) for message in messages]


# -- load, joins and heartbeats (agent -> Conductor) ---------------------------------------
def load_to_proto(load: AgentLoad) -> tuple[pb.PrefillLoad, pb.DecodeLoad, pb.Memory]:
    """The three load messages GetState and Heartbeat carry."""
    return (
        pb.PrefillLoad(
            num_queued=load.num_queued,
            num_running=load.num_running,
            queued_tokens=load.queued_tokens,
        ),
        pb.DecodeLoad(
            batch_size=load.batch_size,
            context_tokens=load.context_tokens,
            predicted_tbt_s=load.predicted_tbt_s,
            tbt_slo_s=load.tbt_slo_s,
            last_step_s=load.last_step_s,
        ),
        pb.Memory(
            dram_bytes=load.dram_bytes,
            dram_capacity_bytes=load.dram_capacity_bytes,
            ssd_bytes=load.ssd_bytes,
            ssd_capacity_bytes=load.ssd_capacity_bytes,
            num_dram_blocks=load.num_dram_blocks,
            num_ssd_blocks=load.num_ssd_blocks,
            num_pinned_keys=load.num_pinned_keys,
            num_pending_handoffs=load.num_pending_handoffs,
        ),
    )


def load_from_proto(prefill: pb.PrefillLoad, decode: pb.DecodeLoad, memory: pb.Memory) -> AgentLoad:
    return AgentLoad(
        num_queued=prefill.num_queued,
        num_running=prefill.num_running,
        queued_tokens=prefill.queued_tokens,
        batch_size=decode.batch_size,
        context_tokens=decode.context_tokens,
        predicted_tbt_s=decode.predicted_tbt_s,
        tbt_slo_s=decode.tbt_slo_s,
        last_step_s=decode.last_step_s,
        dram_bytes=memory.dram_bytes,
        dram_capacity_bytes=memory.dram_capacity_bytes,
        ssd_bytes=memory.ssd_bytes,
        ssd_capacity_bytes=memory.ssd_capacity_bytes,
        num_dram_blocks=memory.num_dram_blocks,
        num_ssd_blocks=memory.num_ssd_blocks,
        num_pinned_keys=memory.num_pinned_keys,
        num_pending_handoffs=memory.num_pending_handoffs,
    )


def join_to_proto(join: Join) -> pb.JoinRequest:
    return pb.JoinRequest(
        instance_id=join.instance_id,
        role=role_to_proto(join.role),
        control_address=join.control_address,
        data_address=join.data_address,
        transport=join.transport,
        preset=join.preset,
        block_size=join.block_size,
        kv_capacity_tokens=join.kv_capacity_tokens,
        dram_capacity_bytes=join.dram_capacity_bytes,
        ssd_capacity_bytes=join.ssd_capacity_bytes,
        now_s=join.now_s,
        incarnation=join.incarnation,
    )


def join_from_proto(message: pb.JoinRequest) -> Join:
    """The join; ValueError for a missing instance id or role."""
    if not message.instance_id:
        raise ValueError("a join needs an instance id")
    return Join(
        now_s=message.now_s,
        instance_id=message.instance_id,
        role=role_from_proto(message.role),
        control_address=message.control_address,
        data_address=message.data_address,
        transport=message.transport,
        preset=message.preset,
        block_size=message.block_size,
        kv_capacity_tokens=message.kv_capacity_tokens,
        dram_capacity_bytes=message.dram_capacity_bytes,
        ssd_capacity_bytes=message.ssd_capacity_bytes,
        incarnation=message.incarnation,
    )


def heartbeat_to_proto(heartbeat: Heartbeat) -> pb.HeartbeatRequest:
    prefill, decode, memory = load_to_proto(heartbeat.load)
    return pb.HeartbeatRequest(
        instance_id=heartbeat.instance_id,
        sequence=heartbeat.sequence,
        now_s=heartbeat.now_s,
        role=role_to_proto(heartbeat.role),
        draining=heartbeat.draining,
        prefill=prefill,
        decode=decode,
        memory=memory,
        events=kv_events_to_proto(heartbeat.events),
        first_event_index=heartbeat.first_event_index,
        num_dropped_events=heartbeat.num_dropped_events,
        final=heartbeat.is_final,
        prefill_samples=[
            pb.PrefillSample(
                input_tokens=s.input_tokens,
                cached_tokens=s.cached_tokens,
                fetched_tokens=s.fetched_tokens,
                seconds=s.seconds,
                queue_s=s.queue_s,
                age_s=max(0.0, heartbeat.now_s - s.time_s),
                cpu_s=s.cpu_s,
                fetch_s=s.fetch_s,
                handover_s=s.handover_s,
            )
            for s in heartbeat.prefill_samples
        ],
        decode_steps=[
            pb.DecodeStepSample(
                batch_size=s.batch_size,
                context_tokens=s.context_tokens,
                seconds=s.seconds,
                age_s=max(0.0, heartbeat.now_s - s.time_s),
                cpu_s=s.cpu_s,
                pause_s=s.pause_s,
            )
            for s in heartbeat.decode_steps
        ],
        host_cpu=_host_cpu_to_proto(heartbeat.host_cpu),
    )


def _host_cpu_to_proto(sample: HostCpuSample | None) -> pb.HostCpuSample | None:
    if sample is None:
        return None
    return pb.HostCpuSample(
        host_id=sample.host_id, cpus=sample.cpus, busy_s=sample.busy_s, total_s=sample.total_s
    )


def _host_cpu_from_proto(message: pb.HeartbeatRequest) -> HostCpuSample | None:
    """The heartbeat's host counters, at its own time; None where it carries none. As the
    samples, taken as sent: the Conductor keeps only sound ones (`is_sound`), so a bad
    measurement costs that measurement, not the heartbeat's liveness and KV events."""
    if not message.HasField("host_cpu"):
        return None
    sample = message.host_cpu
    return HostCpuSample(message.now_s, sample.host_id, sample.cpus, sample.busy_s, sample.total_s)


def heartbeat_from_proto(message: pb.HeartbeatRequest) -> Heartbeat:
    """The heartbeat; ValueError for a missing instance id, role or a bad event."""
    if not message.instance_id:
        raise ValueError("a heartbeat needs an instance id")
    return Heartbeat(
        now_s=message.now_s,
        instance_id=message.instance_id,
        sequence=message.sequence,
        role=role_from_proto(message.role),
        draining=message.draining,
        load=load_from_proto(message.prefill, message.decode, message.memory),
        events=tuple(kv_events_from_proto(message.events)),
        first_event_index=message.first_event_index,
        num_dropped_events=message.num_dropped_events,
        is_final=message.final,
        # When each ended by the heartbeat's clock; the Conductor moves them onto its own.
        prefill_samples=tuple(
            PrefillSample(
                time_s=message.now_s - s.age_s,
                input_tokens=s.input_tokens,
                cached_tokens=s.cached_tokens,
                seconds=s.seconds,
                queue_s=s.queue_s,
                fetched_tokens=s.fetched_tokens,
                cpu_s=s.cpu_s if s.HasField("cpu_s") else None,
                fetch_s=s.fetch_s,
                handover_s=s.handover_s if s.HasField("handover_s") else None,
            )
            for s in message.prefill_samples
        ),
        decode_steps=tuple(
            DecodeStepSample(
                message.now_s - s.age_s,
                s.batch_size,
                s.context_tokens,
                s.seconds,
                s.cpu_s if s.HasField("cpu_s") else None,
                s.pause_s if s.HasField("pause_s") else None,
            )
            for s in message.decode_steps
        ),
        host_cpu=_host_cpu_from_proto(message),
    )
