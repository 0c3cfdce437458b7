"""The proto <-> policy conversions round-trip, table-driven, with real messages."""

import pytest

from backend.policy.calibration import DecodeStepSample, HostCpuSample, PrefillSample
from backend.policy.effects import CachePlan, DispatchPrefill, FetchSpan
from backend.policy.events import KvDemoted, KvEvicted, KvStored
from backend.policy.index import Tier
from backend.rpc import agent_pb2 as pb
from backend.rpc.convert import (
    cache_plan_from_proto,
    cache_plan_to_proto,
    dispatch_prefill_to_proto,
    heartbeat_from_proto,
    heartbeat_to_proto,
    join_from_proto,
    join_to_proto,
    kv_event_from_proto,
    kv_event_to_proto,
    role_from_proto,
    role_to_proto,
)
from backend.rpc.reports import AgentLoad, Heartbeat, Join

BIG_KEY = 2**64 - 1


@pytest.mark.parametrize(
    "event",
    [
        KvStored(1.5, "p1", (1, BIG_KEY), Tier.DRAM),
        KvStored(2.0, "p1", (3,), Tier.SSD),
        KvEvicted(3.0, "p2", (BIG_KEY,)),
        KvDemoted(4.0, "p2", (5, 6)),
    ],
)
def test_kv_events_round_trip(event) -> None:
    wire = pb.KvEvent.FromString(kv_event_to_proto(event).SerializeToString())
    assert kv_event_from_proto(wire) == event


@pytest.mark.parametrize(
    ("plan", "address"),
    [
        (CachePlan((1, 2), None, 128, 10), None),
        (CachePlan((1,), FetchSpan("p2", (2, BIG_KEY)), 192, 5), "127.0.0.1:9"),
        (CachePlan((), FetchSpan("p2", (7,)), 64, 1), "127.0.0.1:9"),
    ],
)
def test_cache_plans_round_trip_with_the_fetch_address(plan, address) -> None:
    message = cache_plan_to_proto(plan, {"p2": "127.0.0.1:9"})
    assert cache_plan_from_proto(pb.CachePlan.FromString(message.SerializeToString())) == (
        plan,
        address,
    )


def test_dispatch_prefill_resolves_the_decode_address() -> None:
    plan = CachePlan((), FetchSpan("p2", (7,)), 64, 1)
    effect = DispatchPrefill("r1", "p1", "d1", plan, 0.0, 0.0, 0.0, 0.0, ())
    addresses = {"p2": "h:1", "d1": "h:2"}
    message = dispatch_prefill_to_proto(effect, [1, 2, 3], addresses, replicate=True)
    assert (message.request_id, message.decode_data_address, message.replicate) == (
        "r1",
        "h:2",
        True,
    )
    assert list(message.token_ids) == [1, 2, 3]
    assert message.plan.fetch.source_data_address == "h:1"


def test_roles_and_bad_enums() -> None:
    assert role_from_proto(role_to_proto("decode")) == "decode"
    with pytest.raises(ValueError, match="PREFILL or DECODE"):
        role_from_proto(pb.ROLE_UNSPECIFIED)
    with pytest.raises(ValueError, match="tier"):
        kv_event_from_proto(pb.KvEvent(kind=pb.KvEvent.STORED, keys=[1]))


def test_joins_and_heartbeats_round_trip() -> None:
    join = Join(1.0, "p1", "prefill", "127.0.0.1:1", "127.0.0.1:2", "tcp", "tiny", 64, 640, 9, 0)
    assert (
        join_from_proto(pb.JoinRequest.FromString(join_to_proto(join).SerializeToString())) == join
    )
    load = AgentLoad(1, 2, 300, 4, 500, 0.25, 0.5, 0.125, 7, 8, 9, 10, 11, 12, 13, 14)
    events = (KvStored(1.5, "d1", (1, BIG_KEY), Tier.SSD), KvEvicted(2.0, "d1", (3,)))
    beat = Heartbeat(2.5, "d1", 7, "decode", True, load, events, BIG_KEY - 5, 3, True)
    wire = pb.HeartbeatRequest.FromString(heartbeat_to_proto(beat).SerializeToString())
    assert heartbeat_from_proto(wire) == beat
    with pytest.raises(ValueError, match="instance id"):
        heartbeat_from_proto(pb.HeartbeatRequest(role=pb.DECODE))
    with pytest.raises(ValueError, match="role"):
        join_from_proto(pb.JoinRequest(instance_id="p1"))


def test_measurements_keep_when_they_ended_across_the_wire() -> None:
    """Each sample says how long before its heartbeat it ended, so the Conductor sees how
    the agents' work overlapped (host sharing reads it), not every sample at one instant."""
    # The CPU time each got travels too, and "not measured" stays distinct from zero; so do
    # a prefill's seconds fetching (the live profile's link is fitted from them).
    prefill = (
        PrefillSample(99.25, 300, 64, 0.5, 0.125, 16, cpu_s=0.25, fetch_s=0.0625),
        PrefillSample(99.75, 10, 0, 0.25),
    )
    steps = (
        DecodeStepSample(99.5, 3, 900, 0.0625, cpu_s=0.0),
        DecodeStepSample(99.875, 2, 600, 0.03125),
    )
    beat = Heartbeat(
        100.0, "p1", 1, "prefill", False, AgentLoad(), prefill_samples=prefill, decode_steps=steps
    )
    wire = pb.HeartbeatRequest.FromString(heartbeat_to_proto(beat).SerializeToString())
    assert heartbeat_from_proto(wire) == beat


def test_the_hosts_cpu_counters_travel_at_the_heartbeats_time_as_sent() -> None:
    counters = HostCpuSample(100.0, "boot-1", 2, 1234.5, 4000.25)
    beat = Heartbeat(100.0, "p1", 1, "prefill", False, AgentLoad(), host_cpu=counters)
    wire = pb.HeartbeatRequest.FromString(heartbeat_to_proto(beat).SerializeToString())
    assert heartbeat_from_proto(wire) == beat
    without = Heartbeat(100.0, "p1", 2, "prefill", False, AgentLoad())
    assert heartbeat_from_proto(heartbeat_to_proto(without)).host_cpu is None
    bad = heartbeat_to_proto(beat)
    bad.host_cpu.busy_s = 5000.0  # more busy than there was time: the Conductor drops it
    received = heartbeat_from_proto(bad).host_cpu  # (tests/runtime/test_membership.py)
    assert received is not None and not received.is_sound()
    assert counters.is_sound()
