"""The twin's pool shard keeps the Conductor's index exact in the corner cases of promotion."""

from backend.policy import PrefixIndex
from tests.kv_events import replay_kv_events
from twin.shard import PoolShard


def replay(events, index: PrefixIndex) -> None:
    replay_kv_events(index, events)


def held(shard: PoolShard) -> set[int]:
    return {key for key in range(100) if shard.holds(key)}


def test_a_promotion_that_finds_no_room_is_reported_as_evicted() -> None:
    shard, index = PoolShard("p", dram_blocks=2, ssd_blocks=4, eviction_policy="lru"), PrefixIndex()
    replay(shard.store([1, 2], 0.0), index)
    replay(shard.store([3, 4], 1.0), index)  # 1, 2 demoted to SSD
    shard.pin([3, 4])  # DRAM is now all pinned
    replay(shard.store([1], 2.0), index)  # 1 leaves SSD for DRAM, which has no room
    assert index.prefix_blocks([1], ["p"]) == {"p": 0}
    assert held(shard) == {2, 3, 4}
    assert {key for key in range(10) if index.tier_of("p", key)} == held(shard)


def test_a_block_pinned_on_ssd_is_held_in_one_tier_only() -> None:
    shard, index = PoolShard("p", dram_blocks=2, ssd_blocks=4, eviction_policy="lru"), PrefixIndex()
    replay(shard.store([1, 2], 0.0), index)
    replay(shard.store([3, 4], 1.0), index)  # 1, 2 on SSD
    shard.pin([1])
    replay(shard.store([1, 5], 2.0), index)
    assert (1 in shard.dram) + (shard.ssd is not None and 1 in shard.ssd) == 1
    assert {key for key in range(10) if index.tier_of("p", key)} == held(shard)
