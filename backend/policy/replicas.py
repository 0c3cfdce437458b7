"""Replica cap: when hot-spot migration has copied a block to too many shards, trim it.

The copy kept is the one on the shard that just stored it (where load sent the request);
extra copies are dropped from the fullest holders first, which frees the most pressed pools.
"""

from collections.abc import Sequence

from backend.policy.effects import Evict
from backend.policy.index import PrefixIndex


def plan_replica_cap(
    index: PrefixIndex, stored_on: str, keys: Sequence[int], max_replicas: int
) -> tuple[Evict, ...]:
    """Evict effects that bring every key in `keys` back to at most `max_replicas` copies."""
    victims: dict[str, list[int]] = {}
    for key in keys:
        holders = index.holders(key)
        excess = len(holders) - max_replicas
        if excess <= 0:
            continue
        others = sorted(
            (holder for holder in holders if holder != stored_on),
            key=lambda holder: (-index.num_blocks(holder), holder),
        )
        for holder in others[:excess]:
            victims.setdefault(holder, []).append(key)
    return tuple(Evict(instance, tuple(keys_)) for instance, keys_ in victims.items())
