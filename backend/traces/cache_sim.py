"""Replay of a trace's prefix blocks through one BlockCache: the hit ratio of an eviction policy."""

from collections.abc import Iterable

from backend.policy.block_cache import BlockCache
from backend.traces.loader import TraceRow


def simulate_cache(rows: Iterable[TraceRow], policy: str, capacity_blocks: int | None) -> dict:
    """Replay `rows` in order through one `BlockCache(capacity_blocks, policy)`.

    Keys are the trace's hash ids; a block's depth is its index in its request. A request's
    hits are the blocks of its longest cached prefix (`match_prefix` at its arrival time),
    counted before it inserts all of its blocks in order (`BlockCache.insert_blocks`: a
    request never evicts its own blocks; blocks that find no room are not cached,
    `refused_blocks`). `capacity_blocks=None` is unlimited.
    """
    cache = BlockCache(capacity_blocks, policy)
    num_requests = 0
    num_blocks = 0
    num_hits = 0
    num_requests_with_hits = 0
    num_evictions = 0
    num_refused = 0
    for row in rows:
        now_s = row.timestamp_ms / 1000
        keys = row.hash_ids
        matched = cache.match_prefix(keys, now_s)
        num_requests += 1
        num_blocks += len(keys)
        num_hits += matched
        num_requests_with_hits += matched > 0
        inserted = cache.insert_blocks(keys, now_s)
        num_evictions += len(inserted.evicted)
        num_refused += inserted.num_refused
    return {
        "policy": policy,
        "capacity_blocks": capacity_blocks,
        "num_requests": num_requests,
        "num_blocks": num_blocks,
        "hits": num_hits,
        "hit_ratio": num_hits / num_blocks if num_blocks else 0.0,
        "requests_with_hits": num_requests_with_hits,
        "evictions": num_evictions,
        "refused_blocks": num_refused,
        "cached_blocks_at_end": len(cache),
    }
