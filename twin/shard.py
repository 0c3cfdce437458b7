"""PoolShard: one instance's KV pool shard in the twin (DRAM tier, optional SSD tier).

Holds keys only (no bytes), through the policy's own BlockCache and eviction order.
Evicting from DRAM demotes to SSD when there is one; using a block from SSD promotes it
back. Every change is returned as KV events for the Conductor core, so its index stays
exact. Pinned blocks are never evicted (checked on every eviction).
"""

from collections.abc import Sequence

from backend.policy.block_cache import BlockCache
from backend.policy.events import KvDemoted, KvEvicted, KvStored
from backend.policy.index import Tier

KvEvent = KvStored | KvEvicted | KvDemoted


class PoolShard:
    """DRAM (+ SSD) block caches of one instance, emitting KV events for every change."""

    def __init__(
        self, instance_id: str, dram_blocks: int, ssd_blocks: int, eviction_policy: str
    ) -> None:
        self.instance_id = instance_id
        self.dram = BlockCache(dram_blocks, eviction_policy)
        self.ssd = BlockCache(ssd_blocks, eviction_policy) if ssd_blocks > 0 else None
        self.max_dram_blocks = 0
        self.max_ssd_blocks = 0
        # Position of each held block in its prompt, for length-aware demotion to SSD.
        self._depth: dict[int, int] = {}

    def holds(self, key: int) -> bool:
        return key in self.dram or (self.ssd is not None and key in self.ssd)

    def count_on_ssd(self, keys: Sequence[int]) -> int:
        """How many of `keys` would be read from the SSD tier."""
        if self.ssd is None:
            return 0
        ssd = self.ssd
        return sum(1 for key in keys if key in ssd)

    def touch(self, keys: Sequence[int], now_s: float) -> None:
        """Reused blocks count as accesses for the eviction order."""
        dram, ssd = self.dram, self.ssd
        for key in keys:
            if key in dram:
                dram.touch(key, now_s)
            elif ssd is not None:
                ssd.touch(key, now_s)

    def pin(self, keys: Sequence[int]) -> None:
        self.dram.pin(keys)
        if self.ssd is not None:
            self.ssd.pin(keys)

    def unpin(self, keys: Sequence[int]) -> None:
        self.dram.unpin(keys)
        if self.ssd is not None:
            self.ssd.unpin(keys)

    def store(self, keys: Sequence[int], now_s: float) -> list[KvEvent]:
        """Store a prompt's blocks in DRAM (promoting any on SSD); demote or drop victims."""
        events: list[KvEvent] = []
        ssd = self.ssd
        promoted: list[int] = []
        if ssd is not None:
            promoted = [key for key in keys if key in ssd and ssd.remove(key)]
            # A block pinned on SSD stays there (and stays held): it is not copied to DRAM.
            keys = [key for key in keys if key not in ssd]
        depth = self._depth
        for position, key in enumerate(keys):
            depth[key] = position
        inserted = self.dram.insert_blocks(keys, now_s)
        lost = [key for key in promoted if key not in self.dram]
        if lost:  # taken off SSD to promote, but DRAM had no unpinned room for it
            events.append(KvEvicted(now_s, self.instance_id, tuple(lost)))
            for key in lost:
                depth.pop(key, None)
        self._check_unpinned(self.dram, inserted.evicted)
        if inserted.evicted:
            if ssd is None:
                events.append(KvEvicted(now_s, self.instance_id, tuple(inserted.evicted)))
                for key in inserted.evicted:
                    depth.pop(key, None)
            else:
                events.extend(self._demote(inserted.evicted, now_s))
        held = tuple(key for key in keys if key in self.dram)
        if held:
            events.append(KvStored(now_s, self.instance_id, held, Tier.DRAM))
        self.max_dram_blocks = max(self.max_dram_blocks, len(self.dram))
        return events

    def _demote(self, keys: list[int], now_s: float) -> list[KvEvent]:
        ssd = self.ssd
        assert ssd is not None
        depth = self._depth
        evicted: list[int] = []
        for key in keys:
            _, pushed_out = ssd.insert(key, now_s, depth.get(key, 0))
            evicted.extend(pushed_out)
        self._check_unpinned(ssd, evicted)
        events: list[KvEvent] = []
        dropped = list(dict.fromkeys(key for key in (*evicted, *keys) if key not in ssd))
        for key in dropped:
            depth.pop(key, None)
        if dropped:
            events.append(KvEvicted(now_s, self.instance_id, tuple(dropped)))
        demoted = tuple(key for key in keys if key in ssd)
        if demoted:
            events.append(KvDemoted(now_s, self.instance_id, demoted))
        self.max_ssd_blocks = max(self.max_ssd_blocks, len(ssd))
        return events

    def drop(self, keys: Sequence[int], now_s: float) -> list[KvEvent]:
        """Remove `keys` (an Evict effect); pinned blocks stay."""
        removed = [key for key in keys if self.dram.remove(key) or self._remove_ssd(key)]
        for key in removed:
            self._depth.pop(key, None)
        return [KvEvicted(now_s, self.instance_id, tuple(removed))] if removed else []

    def _remove_ssd(self, key: int) -> bool:
        return self.ssd is not None and self.ssd.remove(key)

    @staticmethod
    def _check_unpinned(cache: BlockCache, evicted: list[int]) -> None:
        for key in evicted:
            if cache.is_pinned(key):
                raise RuntimeError(f"pinned block {key} was evicted")
