"""Eviction order per policy, and pinned blocks never evicted, demoted or dropped."""

import pytest

from backend.policy import KvDemoted, KvEvicted, KvStored, Tier
from tests.agents.pool.helpers import make_shard, store

A, B, C, D = 0xA, 0xB, 0xC, 0xD


def _frequencies(shard):
    """A stored first and read most often; B and C read twice each, C last."""
    for now_s, key in enumerate([A, B, C]):
        store(shard, [key], float(now_s))
    for now_s, key in enumerate([A, A, A, B, C], start=3):
        shard.load([key], float(now_s))


def _one_long_prompt(shard):
    store(shard, [A, B, C], 0.0)  # depths 0, 1, 2 at one instant


@pytest.mark.parametrize(
    ("scenario", "policy", "victim"),
    [
        (_frequencies, "lru", A),
        (_frequencies, "lfu", B),
        (_frequencies, "length-aware", A),
        (_one_long_prompt, "lru", A),
        (_one_long_prompt, "lfu", A),
        (_one_long_prompt, "length-aware", C),
    ],
)
def test_the_policy_chooses_the_victim(scenario, policy, victim):
    shard = make_shard(3, policy=policy)
    scenario(shard)
    result = store(shard, [D], 10.0)
    assert result.events == [
        KvEvicted(10.0, "prefill-00", (victim,)),
        KvStored(10.0, "prefill-00", (D,), Tier.DRAM),
    ]
    assert set(shard.holdings()) == {A, B, C, D} - {victim}


def test_a_full_shard_of_pinned_blocks_refuses_new_blocks_clearly():
    shard = make_shard(2)
    store(shard, [A, B], 0.0)
    shard.pin([A, B])
    refused = store(shard, [C, D], 1.0)
    assert refused.refused_keys == (C, D) and not refused.is_complete
    assert refused.events == []
    assert set(shard.holdings()) == {A, B}
    assert shard.stats().num_refused == 2
    shard.unpin([A])
    partial = store(shard, [C, D], 2.0)
    assert partial.refused_keys == (D,)  # the deepest block is the one left out
    assert set(shard.holdings()) == {B, C}


def test_pins_are_reference_counted():
    shard = make_shard(1)
    store(shard, [A], 0.0)
    shard.pin([A])
    shard.pin([A])
    shard.unpin([A])
    assert store(shard, [B], 1.0).refused_keys == (B,)
    shard.unpin([A])
    shard.unpin([A])  # one too many is harmless
    assert store(shard, [B], 2.0).is_complete
    assert set(shard.holdings()) == {B}


def test_evict_drops_unpinned_blocks_and_keeps_pinned_ones(tmp_path):
    shard = make_shard(1, ssd_dir=tmp_path, ssd_blocks=4)
    store(shard, [A], 0.0)
    store(shard, [B], 1.0)  # A demoted to SSD
    shard.pin([B])
    events = shard.evict([A, B, C], 2.0)
    assert events == [KvEvicted(2.0, "prefill-00", (A,))]
    assert shard.holdings() == {B: Tier.DRAM}
    assert list(tmp_path.iterdir()) == []


def test_pinned_blocks_are_never_demoted(tmp_path):
    shard = make_shard(2, ssd_dir=tmp_path, ssd_blocks=8)
    store(shard, [A, B], 0.0)
    shard.pin([A])
    for now_s, key in enumerate([C, D, 0xE], start=1):
        result = store(shard, [key], float(now_s))
        moved = [event for event in result.events if isinstance(event, KvDemoted | KvEvicted)]
        assert moved and all(A not in event.keys for event in moved)
    assert shard.holdings()[A] == Tier.DRAM
