"""The global prefix index: which block keys each instance's pool shard holds, and where.

Kept exact by stored / evicted / demoted KV events. A lookup walks the request's keys once
and narrows the set of instances still matching, so its cost is bounded by the request's
length and the number of holders, never by the size of the index.
"""

from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum


class Tier(StrEnum):
    """A storage tier of a pool shard."""

    DRAM = "dram"
    SSD = "ssd"


class PrefixIndex:
    """Key -> {instance_id: tier} and instance_id -> keys, updated by KV events."""

    def __init__(self) -> None:
        self._holders: dict[int, dict[str, Tier]] = {}
        self._keys_by_instance: dict[str, set[int]] = {}

    # -- updates --------------------------------------------------------------------------
    def on_stored(self, instance_id: str, keys: Iterable[int], tier: Tier = Tier.DRAM) -> None:
        """Record that `instance_id` now holds `keys` in `tier` (a promotion re-stores)."""
        owned = self._keys_by_instance.setdefault(instance_id, set())
        holders = self._holders
        for key in keys:
            entry = holders.get(key)
            if entry is None:
                holders[key] = {instance_id: tier}
            else:
                entry[instance_id] = tier
            owned.add(key)

    def on_evicted(self, instance_id: str, keys: Iterable[int]) -> None:
        """Record that `instance_id` dropped `keys` from every tier."""
        owned = self._keys_by_instance.get(instance_id)
        if owned is None:
            return
        holders = self._holders
        for key in keys:
            owned.discard(key)
            entry = holders.get(key)
            if entry is not None and entry.pop(instance_id, None) is not None and not entry:
                del holders[key]

    def on_demoted(self, instance_id: str, keys: Iterable[int]) -> None:
        """Record that `instance_id` moved `keys` from DRAM to its SSD tier."""
        for key in keys:
            entry = self._holders.get(key)
            if entry is not None and instance_id in entry:
                entry[instance_id] = Tier.SSD

    def drop_instance(self, instance_id: str) -> int:
        """Forget everything `instance_id` held (it left or died); returns blocks dropped."""
        owned = self._keys_by_instance.pop(instance_id, set())
        holders = self._holders
        for key in owned:
            entry = holders.get(key)
            if entry is not None:
                entry.pop(instance_id, None)
                if not entry:
                    del holders[key]
        return len(owned)

    # -- lookups --------------------------------------------------------------------------
    def holders(self, key: int) -> Mapping[str, Tier]:
        """Instances holding `key`, with the tier each holds it in (empty if none)."""
        return self._holders.get(key, {})

    def prefix_blocks(self, keys: Sequence[int], instance_ids: Iterable[str]) -> dict[str, int]:
        """Number of leading `keys` each instance holds (its longest cached prefix, in blocks)."""
        lengths = dict.fromkeys(instance_ids, 0)
        matching = list(lengths)
        holders = self._holders
        for depth, key in enumerate(keys, start=1):
            entry = holders.get(key)
            if entry is None:
                break
            matching = [instance for instance in matching if instance in entry]
            if not matching:
                break
            for instance in matching:
                lengths[instance] = depth
        return lengths

    def num_blocks(self, instance_id: str) -> int:
        """Blocks `instance_id` holds across its tiers."""
        return len(self._keys_by_instance.get(instance_id, ()))

    def num_replicas(self, key: int) -> int:
        """How many shards hold `key`."""
        return len(self._holders.get(key, ()))

    def tier_of(self, instance_id: str, key: int) -> Tier | None:
        """The tier `instance_id` holds `key` in, or None."""
        return self._holders.get(key, {}).get(instance_id)

    def __len__(self) -> int:
        """Distinct keys held anywhere in the pool."""
        return len(self._holders)
