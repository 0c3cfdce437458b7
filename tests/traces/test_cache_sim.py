"""Cache simulation: hand-computed replays under each policy, pinning, and the shipped trace."""

import pytest

from backend.traces.cache_sim import simulate_cache
from backend.traces.loader import iter_trace
from backend.traces.stats import trace_stats
from tests.traces.builders import full_blocks_row

# Five requests through a cache of 3 blocks (ids; depth = position in the request):
#   t=0 s  A [1, 2]   t=1 s  B [1, 2]   t=2 s  C [3]   t=3 s  D [4]   t=4 s  E [1, 2]
# A misses both and stores 1 (depth 0), 2 (depth 1). B hits 1, 2 (2 hits); under LFU each
# hit counts as a use: frequency 1 -> 2. C stores 3:
# the cache is full {1, 2, 3}. D (no hits) must evict one block:
#   LRU evicts 1 (used at t=1, just before 2; 3 at t=2)       -> {2, 3, 4}
#   LFU evicts 3 (frequency 1 against 2 and 2)                 -> {1, 2, 4}
#   length-aware evicts 2 (depth 1, the only deep block)       -> {1, 3, 4}
# E asks for [1, 2]:
#   LRU: 1 is gone -> 0 hits. Stores 1 (E's own blocks are never evicted): evicts 3
#        (t=2 before 4 at t=3). Evictions 2.
#   LFU: 1, 2 cached -> 2 hits, nothing to store. Evictions 1.
#   length-aware: 1 cached, 2 not -> 1 hit. Stores 2: depth-0 ties 3 (t=2), 4 (t=3),
#        1 is E's own -> evicts 3. Evictions 2.
# Blocks: 2 + 2 + 1 + 1 + 2 = 8. Hits: LRU 2 + 0, LFU 2 + 2, length-aware 2 + 1.
EVICTING_TRACE = [
    full_blocks_row(0, [1, 2]),
    full_blocks_row(1000, [1, 2]),
    full_blocks_row(2000, [3]),
    full_blocks_row(3000, [4]),
    full_blocks_row(4000, [1, 2]),
]


@pytest.mark.parametrize(
    ("policy", "hits", "evictions"),
    [("lru", 2, 2), ("lfu", 4, 1), ("length-aware", 3, 2)],
)
def test_a_full_cache_gives_each_policy_its_hand_computed_hit_ratio(
    write_trace, policy, hits, evictions
):
    path = write_trace(EVICTING_TRACE)

    result = simulate_cache(iter_trace(path), policy, capacity_blocks=3)

    assert result["num_requests"] == 5
    assert result["num_blocks"] == 8
    assert result["hits"] == hits
    assert result["hit_ratio"] == hits / 8
    assert result["evictions"] == evictions
    assert result["refused_blocks"] == 0
    assert result["cached_blocks_at_end"] == 3


@pytest.mark.parametrize("policy", ["lru", "lfu", "length-aware"])
def test_a_request_never_evicts_its_own_blocks(write_trace, policy):
    # Capacity 1: A stores 1, then 2 finds only the pinned 1 to evict and is not cached.
    # Without pinning, 2 would evict 1 and B would hit nothing. B hits 1: 1 hit of 4 blocks.
    path = write_trace([full_blocks_row(0, [1, 2]), full_blocks_row(1000, [1, 2])])

    result = simulate_cache(iter_trace(path), policy, capacity_blocks=1)

    assert result["hits"] == 1
    assert result["hit_ratio"] == 0.25
    assert result["refused_blocks"] == 2
    assert result["evictions"] == 0
    assert result["requests_with_hits"] == 1


def test_a_cache_of_zero_blocks_caches_nothing(write_trace):
    path = write_trace(EVICTING_TRACE)

    result = simulate_cache(iter_trace(path), "lru", capacity_blocks=0)

    assert (result["hits"], result["refused_blocks"], result["cached_blocks_at_end"]) == (0, 8, 0)


def test_only_the_longest_cached_prefix_counts_as_hits(write_trace):
    # B shares 1 with A, then differs: 1 hit. C = [1, 2, 9]: 1, 2 cached -> 2 hits; C's 9
    # is new. D = [5, 2]: 2 is cached but 5 is not, so no prefix hit at all.
    path = write_trace(
        [
            full_blocks_row(0, [1, 2]),
            full_blocks_row(1, [1, 3]),
            full_blocks_row(2, [1, 2, 9]),
            full_blocks_row(3, [5, 2]),
        ]
    )

    result = simulate_cache(iter_trace(path), "lru", capacity_blocks=None)

    assert result["hits"] == 3
    assert result["num_blocks"] == 9
    assert result["requests_with_hits"] == 2


@pytest.mark.parametrize("policy", ["lru", "lfu", "length-aware"])
def test_an_unlimited_cache_reaches_the_ideal_hit_ratio(write_trace, policy):
    path = write_trace(EVICTING_TRACE)

    result = simulate_cache(iter_trace(path), policy, capacity_blocks=None)

    # Unique ids 1, 2, 3, 4 of 8 blocks: every block seen before is a prefix hit.
    assert result["hits"] == 4
    assert result["hit_ratio"] == trace_stats(iter_trace(path))["ideal_hit_ratio"]
    assert result["evictions"] == 0


def test_an_unknown_policy_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown eviction policy 'fifo'"):
        simulate_cache([], "fifo", capacity_blocks=None)


@pytest.mark.slow
def test_unlimited_lru_on_the_shipped_trace_reaches_the_readme_ratio(shipped_rows):
    result = simulate_cache(shipped_rows, "lru", capacity_blocks=None)

    assert result["num_blocks"] == 288_500
    assert result["hits"] == 288_500 - 182_790
    assert round(result["hit_ratio"], 3) == 0.366


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["lru", "lfu", "length-aware"])
def test_a_bounded_cache_on_the_shipped_trace_loses_hits(shipped_rows, policy):
    result = simulate_cache(shipped_rows, policy, capacity_blocks=50_000)

    assert 0 < result["hits"] < 288_500 - 182_790
    assert result["evictions"] > 0
    assert result["cached_blocks_at_end"] == 50_000
