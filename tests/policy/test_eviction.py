"""Eviction orders through BlockCache: prefix-aware LRU, LRU, LFU, length-aware, and pins."""

import pytest

from backend.policy.block_cache import BlockCache
from backend.policy.eviction import make_eviction_order


def fill(cache: BlockCache, keys_depths_times) -> list[int]:
    evicted = []
    for key, depth, now_s in keys_depths_times:
        stored, dropped = cache.insert(key, now_s, depth)
        assert stored
        evicted.extend(dropped)
    return evicted


@pytest.mark.parametrize(
    ("policy", "expected_victim"),
    [
        # a(depth 0, t0, 3 hits)  b(depth 2, t1, 1 hit)  c(depth 1, t2, 2 hits); a touched at t3
        ("lru", "b"),  # least recently used: b (t1)
        ("prefix-lru", "b"),  # the same: no tie of recency to break
        ("lfu", "b"),  # fewest hits: b (inserted once, never accessed)
        ("length-aware", "b"),  # deepest: b (depth 2)
    ],
)
def test_first_victim(policy, expected_victim) -> None:
    ids = {"a": 1, "b": 2, "c": 3, "d": 4}
    cache = BlockCache(3, policy)
    fill(cache, [(ids["a"], 0, 0.0), (ids["b"], 2, 1.0), (ids["c"], 1, 2.0)])
    cache.touch(ids["a"], 3.0)
    cache.touch(ids["a"], 3.5)
    cache.touch(ids["c"], 4.0)
    evicted = fill(cache, [(ids["d"], 0, 5.0)])
    assert evicted == [ids[expected_victim]]


def test_policies_disagree_where_they_should() -> None:
    # y (10): depth 0, inserted t0, used again at t5 -> 2 uses, most recent
    # z (11): depth 1, inserted t1, never used again -> 1 use, least recent
    # x (12): depth 5, inserted t2, used at t3 and t4 -> 3 uses
    orders = {}
    for policy in ("lru", "lfu", "length-aware"):
        cache = BlockCache(3, policy)
        fill(cache, [(10, 0, 0.0), (11, 1, 1.0), (12, 5, 2.0)])
        cache.touch(12, 3.0)
        cache.touch(12, 4.0)
        cache.touch(10, 5.0)
        orders[policy] = cache.evict(3)
    assert orders["lru"] == [11, 12, 10]  # by last use: t1, t4, t5
    assert orders["lfu"] == [11, 10, 12]  # by uses: 1, 2, 3
    assert orders["length-aware"] == [12, 11, 10]  # by depth: 5, 1, 0


def test_pinned_blocks_are_never_evicted() -> None:
    for policy in ("prefix-lru", "lru", "lfu", "length-aware"):
        cache = BlockCache(2, policy)
        fill(cache, [(1, 0, 0.0), (2, 1, 1.0)])
        cache.pin([1, 2])
        stored, evicted = cache.insert(3, 2.0, 0)
        assert (stored, evicted) == (False, [])
        assert 1 in cache and 2 in cache and 3 not in cache
        assert not cache.remove(1)  # pinned blocks cannot be dropped either
        cache.unpin([2])
        stored, evicted = cache.insert(3, 3.0, 0)
        assert (stored, evicted) == (True, [2])
        cache.pin([1])  # reference counted: two pins need two unpins
        cache.unpin([1])
        assert cache.is_pinned(1)
        cache.unpin([1])
        assert not cache.is_pinned(1)
        assert cache.evict(5) == [1, 3] if policy == "lru" else len(cache.evict(5)) == 2
        assert len(cache) == 0


def test_unlimited_cache_never_evicts_and_zero_capacity_stores_nothing() -> None:
    unlimited = BlockCache(None)
    assert fill(unlimited, [(k, k, float(k)) for k in range(1000)]) == []
    assert len(unlimited) == 1000
    empty = BlockCache(0)
    assert empty.insert(1, 0.0, 0) == (False, [])


def test_match_prefix_stops_at_the_first_miss_and_counts_as_access() -> None:
    cache = BlockCache(3, "lru")
    fill(cache, [(1, 0, 0.0), (2, 1, 1.0), (4, 3, 2.0)])
    assert cache.match_prefix([1, 2, 3, 4], now_s=5.0) == 2
    _, evicted = cache.insert(5, 6.0, 0)
    assert evicted == [4]  # 1 and 2 were just used


def test_unknown_policy_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown eviction policy 'fifo'"):
        make_eviction_order("fifo")


def test_insert_blocks_never_evicts_its_own_batch_and_drops_the_deepest_first() -> None:
    cache = BlockCache(4, "length-aware")
    fill(cache, [(1, 0, 0.0), (2, 1, 0.0), (3, 2, 0.0)])
    cache.pin([1])
    # Four new blocks need three evictions but only 2 and 3 may go (1 is pinned): that
    # leaves room for three, so the deepest new block is left out; no new block evicts
    # another (length-aware would otherwise pick the deep new ones first).
    inserted = cache.insert_blocks([10, 11, 12, 13], now_s=1.0)
    assert sorted(inserted.evicted) == [2, 3]
    assert (inserted.num_stored, inserted.num_refused) == (3, 1)
    assert all(key in cache for key in (10, 11, 12)) and 13 not in cache
    # Blocks already held are neither re-stored nor counted as refused.
    again = cache.insert_blocks([10, 11], now_s=2.0)
    assert (again.num_stored, again.num_refused, again.evicted) == (0, 0, [])


def test_a_prefix_leaves_the_pool_from_its_tail_under_prefix_lru_and_from_its_head_under_lru():
    """A prompt's blocks are stored and reused front to back, at one time each: plain LRU
    (the paper's, `trace cache-sim --policy lru`) evicts the head first, which orphans the
    blocks behind it; the pools' default evicts the tail first, keeping a usable prefix."""
    orders = {}
    for policy in ("lru", "prefix-lru"):
        cache = BlockCache(6, policy)
        cache.insert_blocks([1, 2, 3, 4], 0.0)  # a prompt of four blocks
        cache.insert_blocks([5, 6], 1.0)  # another, later
        assert cache.match_prefix([1, 2, 3], 2.0) == 3  # the first reused, in part, at t2
        inserted = cache.insert_blocks([7, 8, 9], 3.0)
        orders[policy] = inserted.evicted
    assert orders["lru"] == [4, 5, 6]  # t0, then t1 (front to back): 5 before 6
    assert orders["prefix-lru"] == [4, 6, 5]  # t0; then t1's tail first
    cache = BlockCache(4)  # the default
    assert cache.policy == "prefix-lru"
    cache.insert_blocks([1, 2, 3, 4], 0.0)
    assert cache.insert_blocks([5, 6], 1.0).evicted == [4, 3]
    assert cache.match_prefix([1, 2, 3, 4], 2.0) == 2  # the head is still reusable
