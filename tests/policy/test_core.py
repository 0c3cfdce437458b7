"""ConductorCore end to end: lifecycles, agent loss, role switches, replica cap, late checks."""

import pytest

from backend.policy import (
    AgentDraining,
    AgentJoined,
    AgentLeft,
    ConductorCore,
    DecodeFinished,
    DecodeRejected,
    DecodeStarted,
    DecodeStep,
    DispatchDecode,
    DispatchPrefill,
    FailRequest,
    KvDemoted,
    KvEvicted,
    KvLost,
    KvStored,
    PolicyConfig,
    PrefillFinished,
    PrefillStarted,
    RequestArrived,
    RequestFailed,
    RequestRetried,
    Tick,
    Tier,
)
from backend.policy.decode_load import check_decode_arrival
from backend.policy.effects import ArrivalCheck, Evict

from .helpers import linear_cost, make_core

CONFIG = PolicyConfig(block_size=16, rejection_policy="none", kvcache_balancing_threshold=1.0)


def test_a_request_runs_its_whole_life_and_leaves_no_state() -> None:
    core = make_core(CONFIG, linear_cost(), prefill=("P1", "P2"), decode=("D1",))
    keys = (1, 2, 3)
    (dispatch,) = core.handle(RequestArrived(0.0, "r", keys, 50, 8))
    assert core.prefill_loads(0.0)[dispatch.instance_id] > 0
    core.handle(PrefillStarted(0.1, "r", dispatch.instance_id))
    core.handle(KvStored(0.2, dispatch.instance_id, keys))
    (decode,) = core.handle(PrefillFinished(0.2, "r", dispatch.instance_id))
    assert decode == DispatchDecode("r", "D1", 50)  # rejection policy "none": no check
    core.handle(DecodeStarted(0.3, "r", "D1"))
    core.handle(DecodeStep(0.4, "r", 4))
    assert core.decode["D1"].decoding_context_tokens == 54
    assert core.decode_loads()["D1"] > 0
    core.handle(DecodeFinished(1.3, "r"))
    assert core.num_in_flight == 0
    assert core.prefill_loads(2.0) == {"P1": 0.0, "P2": 0.0}
    assert core.decode_loads() == {"D1": 0.0}
    assert core.index.prefix_blocks(keys, ["P1", "P2"])[dispatch.instance_id] == 3
    assert core.handle(Tick(5.0)) == ()


def test_the_next_request_reuses_the_stored_prefix_and_queues_behind() -> None:
    core = make_core(CONFIG, linear_cost(), prefill=("P1", "P2"), decode=("D1",))
    keys = tuple(range(1, 101))  # 1,600 tokens
    core.handle(KvStored(0.0, "P2", keys))
    (first,) = core.handle(RequestArrived(0.0, "a", keys, 1600, 1))
    assert first.instance_id == "P2" and first.plan.num_reused_tokens == 1600
    # A second identical request: P2 has a queue now; P1 fetches all 100 blocks instead.
    core.prefill["P2"].enqueue("long", 10.0)
    second, replicate = core.handle(RequestArrived(0.0, "b", keys, 1600, 1))
    assert second.instance_id == "P1" and second.plan.fetch.source_instance_id == "P2"
    assert replicate.keys == keys
    # P2's link is now busy with that transfer: a third fetch from it queues behind it.
    assert core.prefill["P2"].link_backlog_s(0.0) == pytest.approx(second.estimated_transfer_s)


def test_duplicate_request_ids_are_refused() -> None:
    core = make_core(CONFIG, linear_cost())
    core.handle(RequestArrived(0.0, "r", (), 10, 1))
    with pytest.raises(ValueError, match="already in flight"):
        core.handle(RequestArrived(0.0, "r", (), 10, 1))


def test_losing_a_prefill_instance_reroutes_queued_and_fails_running() -> None:
    core = make_core(CONFIG, linear_cost(), prefill=("P1", "P2"), decode=("D1",))
    core.prefill["P2"].enqueue("hold", 1000.0)  # keep everything on P1
    for name in ("running", "queued1", "queued2"):
        (dispatch,) = core.handle(RequestArrived(0.0, name, (), 1000, 1))
        assert dispatch.instance_id == "P1"
    core.handle(PrefillStarted(0.0, "running", "P1"))
    core.handle(KvStored(0.0, "P1", (7, 8)))

    effects = core.handle(AgentLeft(1.0, "P1", "missed heartbeats"))

    failed = [e for e in effects if isinstance(e, FailRequest)]
    rerouted = [e for e in effects if isinstance(e, DispatchPrefill)]
    assert [f.request_id for f in failed] == ["running"]
    assert "P1" in failed[0].reason and "missed heartbeats" in failed[0].reason
    assert sorted(d.request_id for d in rerouted) == ["queued1", "queued2"]
    assert {d.instance_id for d in rerouted} == {"P2"}
    assert core.index.num_replicas(7) == 0
    assert core.num_in_flight == 2
    # Late events about the failed request or the dead instance change nothing.
    assert core.handle(PrefillFinished(2.0, "running", "P1")) == ()
    assert core.handle(KvStored(2.0, "P1", (9,))) == ()
    assert core.index.num_replicas(9) == 0


def test_losing_the_last_prefill_instance_fails_what_it_held() -> None:
    core = make_core(CONFIG, linear_cost())
    core.handle(RequestArrived(0.0, "queued", (), 10, 1))
    (failed,) = core.handle(AgentLeft(1.0, "P1", "drained"))
    assert failed == FailRequest("queued", "no_prefill_instance")
    assert core.num_in_flight == 0


def test_losing_a_decode_instance_fails_decoding_and_moves_incoming() -> None:
    core = make_core(CONFIG, linear_cost(), prefill=("P1",), decode=("D1", "D2"))
    core.decode["D2"].start("ballast", 0, 0.0)  # D1 looks best at first
    (decoding,) = core.handle(RequestArrived(0.0, "decoding", (), 10, 1))
    assert decoding.decode_instance_id == "D1"
    core.handle(PrefillStarted(0.0, "decoding", "P1"))
    core.handle(PrefillFinished(0.1, "decoding", "P1"))
    core.handle(DecodeStarted(0.1, "decoding", "D1"))
    (waiting,) = core.handle(RequestArrived(0.2, "waiting", (), 10, 1))
    assert waiting.decode_instance_id == "D1"

    (failed,) = core.handle(AgentLeft(0.3, "D1", "crashed"))

    assert failed.request_id == "decoding"
    core.handle(PrefillStarted(0.4, "waiting", "P1"))
    (decode,) = core.handle(PrefillFinished(0.5, "waiting", "P1"))
    assert decode.instance_id == "D2"


def test_role_switch_moves_an_instance_between_pools() -> None:
    core = make_core(CONFIG, linear_cost(), prefill=("A", "B"), decode=("D1",))
    core.handle(KvStored(0.0, "A", (5, 6)))
    core.handle(RequestArrived(0.0, "r", (), 10, 1))
    effects = core.handle(AgentJoined(1.0, "A", "decode", kv_capacity_tokens=4096))
    assert set(core.prefill) == {"B"} and set(core.decode) == {"D1", "A"}
    assert core.decode["A"].kv_capacity_tokens == 4096
    assert all(isinstance(e, DispatchPrefill) and e.instance_id == "B" for e in effects)
    # Its blocks are still in its shard: the index keeps them (a loss would forget them).
    assert core.index.num_blocks("A") == 2


def test_a_draining_instance_gets_no_new_work_but_keeps_what_it_has() -> None:
    core = make_core(CONFIG, linear_cost(), prefill=("P1", "P2"), decode=("D1", "D2"))
    core.prefill["P2"].enqueue("hold", 1000.0)  # P1 looks best
    (kept,) = core.handle(RequestArrived(0.0, "kept", (), 10, 1))
    assert kept.instance_id == "P1"
    core.handle(AgentDraining(0.1, "P1"))
    core.handle(AgentDraining(0.1, kept.decode_instance_id))
    (new,) = core.handle(RequestArrived(0.2, "new", (), 10, 1))
    assert new.instance_id == "P2" and new.decode_instance_id != kept.decode_instance_id
    # The drained request still runs to its decode instance.
    core.handle(PrefillStarted(0.3, "kept", "P1"))
    (decode,) = core.handle(PrefillFinished(0.4, "kept", "P1"))
    assert decode.instance_id == kept.decode_instance_id
    # A join in the same role ends the drain.
    core.handle(AgentJoined(0.5, "P1", "prefill"))
    assert not core.prefill["P1"].draining


def test_draining_the_only_instance_of_a_role_rejects_at_admission() -> None:
    core = make_core(CONFIG, linear_cost())
    core.handle(AgentDraining(0.0, "D1"))
    (reject,) = core.handle(RequestArrived(0.1, "r", (), 10, 1))
    assert reject.reason == "no_decode_instance" and reject.stage == "admission"


@pytest.mark.parametrize("phase", ["queued", "prefilling", "decoding"])
def test_a_failed_request_frees_its_queue_and_batch_places(phase: str) -> None:
    core = make_core(CONFIG, linear_cost())
    core.handle(RequestArrived(0.0, "r", (), 1000, 8))
    if phase != "queued":
        core.handle(PrefillStarted(0.0, "r", "P1"))
    if phase == "decoding":
        core.handle(PrefillFinished(0.5, "r", "P1"))
        core.handle(DecodeStarted(0.5, "r", "D1"))
    now_s = 0.6 if phase == "decoding" else 0.1
    assert core.prefill_loads(now_s)["P1"] > 0 or core.decode_loads()["D1"] > 0

    assert core.handle(RequestFailed(now_s, "r", "stream broke")) == ()

    assert core.num_in_flight == 0
    assert core.prefill_loads(now_s) == {"P1": 0.0} and core.decode_loads() == {"D1": 0.0}
    assert not core.decode["D1"].incoming and not core.decode["D1"].decoding


def test_late_rejection_ends_the_request() -> None:
    core = make_core(PolicyConfig(block_size=16, rejection_policy="baseline"), linear_cost())
    core.handle(RequestArrived(0.0, "r", (), 10, 1))
    core.handle(PrefillStarted(0.0, "r", "P1"))
    core.handle(PrefillFinished(0.1, "r", "P1"))
    core.handle(DecodeRejected(0.1, "r", "D1", "tbt_slo"))
    assert core.num_in_flight == 0 and core.decode["D1"].incoming == {}


def test_kv_events_keep_the_index_and_the_replica_cap_trims_copies() -> None:
    core = ConductorCore(CONFIG, linear_cost(), max_replicas=2)
    for instance_id in ("A", "B", "C"):
        core.handle(AgentJoined(0.0, instance_id, "prefill"))
    core.handle(KvStored(0.0, "A", (1, 2, 3, 4)))  # A is the fullest shard
    core.handle(KvStored(0.0, "B", (1, 2)))
    effects = core.handle(KvStored(0.0, "C", (1, 2)))
    assert effects == (Evict("A", (1, 2)),)
    core.handle(KvEvicted(0.1, "A", (1, 2)))
    core.handle(KvDemoted(0.2, "B", (1,)))
    assert dict(core.index.holders(1)) == {"B": Tier.SSD, "C": Tier.DRAM}


@pytest.mark.parametrize(
    ("batch", "context", "new_context", "capacity", "expected"),
    [
        (8, 0, 0, None, None),  # 9 x 0.01 s = 0.09 s <= 0.1 s
        (9, 0, 0, None, None),  # exactly at the SLO
        (10, 0, 0, None, "tbt_slo"),  # 11 x 0.01 s > 0.1 s
        (0, 900, 200, 1000, "kv_capacity"),
        (0, 800, 200, 1000, None),
    ],
)
def test_local_decode_check(batch, context, new_context, capacity, expected) -> None:
    reason = check_decode_arrival(
        ArrivalCheck(0.1, linear_cost().decode),
        batch_size=batch,
        context_tokens=context,
        new_context_tokens=new_context,
        kv_capacity_tokens=capacity,
    )
    assert reason == expected


def test_an_instance_that_lost_its_kv_events_is_forgotten_in_the_index() -> None:
    core = make_core(CONFIG, linear_cost(), prefill=("P1", "P2"))
    core.handle(KvStored(0.0, "P1", (1, 2)))
    core.handle(KvStored(0.0, "P2", (1,)))
    assert core.handle(KvLost(1.0, "P1")) == ()
    assert core.index.num_blocks("P1") == 0 and core.index.num_replicas(1) == 1
    core.handle(KvStored(2.0, "P1", (3,)))  # re-learned as blocks are stored again
    assert core.index.num_blocks("P1") == 1


def test_the_arrival_check_travels_with_the_dispatch_under_the_configuration_in_force() -> None:
    core = make_core(CONFIG, linear_cost(), prefill=("P1",), decode=("D1",))
    core.reconfigure(PolicyConfig(block_size=16, rejection_policy="early", tbt_slo_s=0.5))
    core.handle(RequestArrived(0.0, "a", (1,), 20, 4))
    core.handle(RequestArrived(0.0, "b", (2,), 20, 4, None, 0.25))  # its own TBT SLO
    (to_decode,) = core.handle(PrefillFinished(0.1, "a", "P1"))
    assert to_decode.arrival_check == ArrivalCheck(0.5, linear_cost().decode)
    (to_decode,) = core.handle(PrefillFinished(0.2, "b", "P1"))
    assert to_decode.arrival_check == ArrivalCheck(0.25, linear_cost().decode)


def test_admission_refuses_past_the_configured_in_flight_limit() -> None:
    config = PolicyConfig(block_size=16, rejection_policy="none", max_in_flight_requests=2)
    core = make_core(config, linear_cost(), prefill=("P1",), decode=("D1",))
    assert type(core.handle(RequestArrived(0.0, "a", (1,), 20, 4))[0]) is DispatchPrefill
    assert type(core.handle(RequestArrived(0.0, "b", (2,), 20, 4))[0]) is DispatchPrefill
    (refused,) = core.handle(RequestArrived(0.0, "c", (3,), 20, 4))
    assert (refused.reason, refused.stage) == ("in_flight_limit", "admission")
    assert "max_in_flight_requests" in refused.message
    core.handle(RequestFailed(0.1, "a", "gone"))  # one ends: room again
    assert type(core.handle(RequestArrived(0.2, "d", (4,), 20, 4))[0]) is DispatchPrefill


def test_a_retried_request_is_placed_again_on_the_instances_there_are_now() -> None:
    """Its KV could not reach D1 (dead, unnoticed until the hand-off): once D1 is out, the
    retry dispatches its prefill again, its decode booked on D2, with no second admission."""
    core = make_core(CONFIG, linear_cost(), prefill=("P1",), decode=("D1", "D2"))
    keys = (1, 2, 3)
    core.handle(AgentLeft(0.0, "D2", "test"))  # the first dispatch has one choice: D1
    (first,) = core.handle(RequestArrived(0.0, "r", keys, 50, 8))
    assert first.decode_instance_id == "D1"
    core.handle(AgentJoined(0.1, "D2", "decode", None))
    core.handle(PrefillStarted(0.1, "r", "P1"))
    core.handle(AgentLeft(0.5, "D1", "unreachable"))
    (again,) = core.handle(RequestRetried(0.5, "r", "KV hand-off to D1 failed"))
    assert isinstance(again, DispatchPrefill)
    assert (again.request_id, again.instance_id, again.decode_instance_id) == ("r", "P1", "D2")
    assert core.num_in_flight == 1
    (decode,) = core.handle(PrefillFinished(0.8, "r", "P1"))
    assert decode.instance_id == "D2"
    core.handle(DecodeFinished(1.0, "r"))
    assert core.num_in_flight == 0
    assert core.handle(RequestRetried(1.1, "r", "late")) == ()  # over: nothing to place
