"""Each branch of Algorithm 1 and the baseline schedulers, table-driven on the pure functions."""

import math
import random

import pytest

from backend.policy import AgentLeft, KvStored, PolicyConfig, RequestArrived
from backend.policy.cost_model import CostModel, DecodeFit, LinkModel, PrefillFit
from backend.policy.routing import PrefillCandidate, route_prefill, uses_transfer

from .helpers import linear_cost, make_core

INF = math.inf


@pytest.mark.parametrize(
    ("prefix_blocks", "best_blocks", "threshold", "expected"),
    [
        (0, 10, 1.0, True),  # nothing local: fetch whenever the threshold is finite
        (0, 10, 1.5, True),
        (0, 10, INF, False),  # inf never fetches
        (5, 10, 1.0, True),  # any longer remote prefix at 1
        (5, 10, 2.0, True),  # 10 >= 2 * 5: the boundary fetches
        (6, 10, 2.0, False),  # 10 < 2 * 6
        (6, 10, 1.5, True),  # 10 >= 9
        (7, 10, 1.5, False),  # 10 < 10.5
        (10, 10, 1.0, False),  # already the best: nothing to fetch
        (0, 0, 1.0, False),  # empty cache everywhere
    ],
)
def test_transfer_branch_rule(prefix_blocks, best_blocks, threshold, expected) -> None:
    assert uses_transfer(prefix_blocks, best_blocks, threshold) is expected


def constant_prefill_cost() -> CostModel:
    """Prefill takes 1 s whatever is cached, so TTFTs tie on queue time alone."""
    return CostModel(
        prefill=PrefillFit(fixed_s=1.0, per_token_s=0.0),
        decode=DecodeFit(0.0, 0.0, 0.0),
        link=LinkModel(100e9),
        kv_bytes_per_token=1,
    )


def route(candidates, prefix, *, scheduler="kvcache-centric", threshold=2.0, cost=None, keys=None):
    keys = keys if keys is not None else tuple(range(100, 120))
    return route_prefill(
        candidates,
        prefix,
        keys,
        scheduler=scheduler,
        num_input_tokens=len(keys) * 16,
        block_size=16,
        threshold=threshold,
        cost=cost or linear_cost(),
        rng=random.Random(7),
    )


def test_ties_go_to_the_longer_local_prefix_then_the_first_candidate() -> None:
    idle = [PrefillCandidate("A", 0.0, 0.0), PrefillCandidate("B", 0.0, 0.0)]
    cost = constant_prefill_cost()
    assert route(idle, {"A": 0, "B": 0}, threshold=INF, cost=cost).chosen.instance_id == "A"
    assert route(idle, {"A": 0, "B": 5}, threshold=INF, cost=cost).chosen.instance_id == "B"
    three = [*idle, PrefillCandidate("C", 0.0, 0.0)]
    choice = route(three, {"A": 3, "B": 3, "C": 0}, threshold=INF, cost=cost)
    assert choice.chosen.instance_id == "A"


def test_empty_cache_routes_to_the_shortest_queue_without_fetching() -> None:
    candidates = [PrefillCandidate("A", 2.0, 0.0), PrefillCandidate("B", 1.0, 0.0)]
    choice = route(candidates, {"A": 0, "B": 0}, threshold=1.0)
    assert choice.chosen.instance_id == "B"
    assert choice.plan.fetch is None and choice.plan.local_keys == ()
    assert all(not e.uses_transfer for e in choice.candidates)


def test_transfer_source_is_the_least_backlogged_holder() -> None:
    candidates = [
        PrefillCandidate("A", 5.0, 3.0),  # holds the best prefix, busy link
        PrefillCandidate("B", 5.0, 0.5),  # also holds it, quieter link
        PrefillCandidate("C", 0.0, 0.0),
    ]
    choice = route(candidates, {"A": 20, "B": 20, "C": 0}, threshold=1.0)
    assert choice.chosen.instance_id == "C"
    assert choice.plan.fetch is not None
    assert choice.plan.fetch.source_instance_id == "B"
    # 20 blocks * 16 tokens * 327,680 B at 100 GB/s, behind the 0.5 s backlog.
    assert choice.chosen.transfer_s == pytest.approx(0.5 + 320 * 327_680 / 100e9)


def test_load_balancing_ignores_the_cache_and_random_is_seeded() -> None:
    candidates = [PrefillCandidate("A", 1.0, 0.0), PrefillCandidate("B", 0.5, 0.0)]
    prefix = {"A": 20, "B": 0}
    balanced = route(candidates, prefix, scheduler="load-balancing", threshold=1.0)
    assert balanced.chosen.instance_id == "B" and balanced.plan.fetch is None
    picks = [route(candidates, prefix, scheduler="random").chosen.instance_id for _ in range(3)]
    assert picks == [picks[0]] * 3  # same seed, same pick
    # The worker still reuses what it holds locally.
    chosen_a = route(candidates, {"A": 20, "B": 0}, scheduler="random", threshold=1.0)
    assert chosen_a.plan.fetch is None


def test_random_scheduler_spreads_over_instances() -> None:
    config = PolicyConfig(block_size=16, prefill_scheduler="random", rejection_policy="none")
    core = make_core(config, linear_cost(), prefill=("A", "B", "C"), decode=("D",))
    chosen = {
        core.handle(RequestArrived(0.0, f"r{n}", (), 10, 1))[0].instance_id for n in range(60)
    }
    assert chosen == {"A", "B", "C"}


def test_a_dead_instance_is_neither_chosen_nor_a_transfer_source() -> None:
    config = PolicyConfig(block_size=16, kvcache_balancing_threshold=1.0, rejection_policy="none")
    core = make_core(config, linear_cost(), prefill=("A", "B", "C"), decode=("D",))
    keys = tuple(range(1, 41))
    core.handle(KvStored(0.0, "A", keys))
    core.handle(KvStored(0.0, "B", keys[:10]))
    core.prefill["A"].enqueue("busy", 100.0)  # A is busy: others fetch from it
    (dispatch, _replicate) = core.handle(RequestArrived(0.0, "r1", keys, 640, 1))
    assert dispatch.instance_id in {"B", "C"}
    assert dispatch.plan.fetch.source_instance_id == "A"

    core.handle(AgentLeft(1.0, "A", "missed heartbeats"))
    assert core.index.num_replicas(keys[0]) == 1  # only B's copy is left
    dispatch, *_ = core.handle(RequestArrived(1.0, "r2", keys, 640, 1))
    assert dispatch.instance_id in {"B", "C"}
    assert {e.instance_id for e in dispatch.candidates} == {"B", "C"}
    assert dispatch.plan.fetch is None or dispatch.plan.fetch.source_instance_id == "B"
