"""KvPoolShard: one agent's KV pool shard, block bytes in DRAM and on an optional SSD tier.

Mirrors the twin's key-only PoolShard (twin/shard.py) with real bytes: the policy's
BlockCache orders each tier, evicting from DRAM demotes to SSD, reading from SSD promotes
back, pinned blocks are never evicted or demoted, and every change comes back as KV events
so the Conductor's index stays exact. One lock guards the bookkeeping; memcpy into DRAM,
checksums and file I/O run outside it, on slots and files that pins keep in place.
"""

import logging
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

from agents.pool import reads
from agents.pool.integrity import CorruptBlock, KvEvent, MissingBlock, checksum
from agents.pool.results import LoadResult, ShardStats, StoreResult
from agents.pool.ssd_files import SsdDir
from agents.pool.state import ShardState, Work
from agents.pool.tiers import DramTier, SsdTier
from backend.policy.events import KvEvicted, KvStored
from backend.policy.eviction import DEFAULT_EVICTION_POLICY
from backend.policy.index import Tier

logger = logging.getLogger(__name__)

Buffer = bytes | bytearray | memoryview

_COUNTED = (
    "stored", "refused", "dram_hits", "ssd_hits", "misses", "evicted", "demoted", "promoted",
    "corrupt", "ssd_write_errors",
)  # fmt: skip


class KvPoolShard:
    """A node's pool shard: blocks of `block_bytes` stored by chained key, checksummed."""

    def __init__(
        self,
        instance_id: str,
        *,
        block_bytes: int,
        dram_capacity_bytes: int,
        ssd_dir: Path | None = None,
        ssd_capacity_bytes: int = 0,
        eviction_policy: str = DEFAULT_EVICTION_POLICY,
    ) -> None:
        if block_bytes <= 0:
            raise ValueError(f"block_bytes must be positive, got {block_bytes}")
        if dram_capacity_bytes < 0 or ssd_capacity_bytes < 0:
            raise ValueError("capacities must be >= 0 bytes")
        num_ssd_blocks = ssd_capacity_bytes // block_bytes
        if (ssd_dir is None) != (num_ssd_blocks == 0):
            raise ValueError(
                "an SSD tier needs both ssd_dir and ssd_capacity_bytes >= block_bytes "
                f"(got ssd_dir={ssd_dir}, ssd_capacity_bytes={ssd_capacity_bytes})"
            )
        self.instance_id = instance_id
        self.block_bytes = block_bytes
        dram = DramTier(dram_capacity_bytes // block_bytes, block_bytes, eviction_policy)
        files = SsdDir(ssd_dir) if ssd_dir is not None else None
        self._state = ShardState(instance_id, dram, SsdTier(num_ssd_blocks, eviction_policy, files))
        self._lock = threading.Lock()

    def pin(self, keys: Iterable[int]) -> None:
        """Keep `keys` (held, or about to be stored) from eviction; reference counted."""
        with self._lock:
            self._state.pin(list(keys))

    def unpin(self, keys: Iterable[int]) -> None:
        with self._lock:
            self._state.unpin(list(keys))

    def store(
        self,
        keys: Sequence[int],
        blocks: Sequence[Buffer],
        now_s: float,
        first_depth: int = 0,
        checksums: Sequence[int] | None = None,
    ) -> StoreResult:
        """Store a prompt's consecutive blocks (depths from `first_depth`) in DRAM.

        Blocks already in DRAM stay as they are; blocks on SSD are promoted. Given the
        sender's `checksums` (after a transfer), a block failing its own raises CorruptBlock
        before anything is stored.
        """
        keys = tuple(keys)
        views = [self._as_block(block) for block in blocks]
        if len(views) != len(keys) or len(set(keys)) != len(keys):
            raise ValueError("store needs one block per key and no key twice")
        sums = [checksum(view) for view in views]
        st = self._state
        if checksums is not None:
            bad = [key for key, got, want in zip(keys, sums, checksums, strict=True) if got != want]
            if bad:
                with self._lock:
                    st.counts["corrupt"] += len(bad)
                raise CorruptBlock(self.instance_id, bad, [])
        work = Work()
        with self._lock:
            dram = st.dram
            held_before = {key for key in keys if key in dram.cache}
            inserted = dram.cache.insert_blocks(keys, now_s, first_depth)
            new = [i for i, key in enumerate(keys) if key in dram.cache and key not in held_before]
            st.pin([keys[i] for i in new])  # until published: not evictable, slot stays put
            st.demote(inserted.evicted, now_s, work)
            for i in new:
                st.depth[keys[i]] = first_depth + i
                work.fills.append((keys[i], dram.add_pending(keys[i]), views[i], sums[i]))
            refused = tuple(k for k in keys if k not in dram.cache and k not in st.ssd.blocks)
            st.counts["refused"] += len(refused)
            st.prune_writes(work)
        try:
            st.do_io(work)
        finally:
            with self._lock:
                st.settle(work, now_s)
                st.unpin([keys[i] for i in new])
                held = tuple(key for key in keys if key in st.dram.blocks)
                if held:
                    work.events.append(KvStored(now_s, self.instance_id, held, Tier.DRAM))
            st.remove_files(work)
        if refused:
            logger.warning(
                "pool shard %s: no unpinned room for %d of %d block(s); not stored",
                self.instance_id, len(refused), len(keys),
            )  # fmt: skip
        return StoreResult(work.events, refused)

    def _as_block(self, block: Buffer) -> memoryview:
        view = memoryview(block).cast("B")
        if view.nbytes != self.block_bytes:
            raise ValueError(f"a block must be {self.block_bytes} bytes, got {view.nbytes}")
        return view

    def load(self, keys: Sequence[int], now_s: float) -> LoadResult:
        """The blocks of `keys`, each checked against its checksum; SSD blocks are promoted.

        Raises MissingBlock for a key the shard does not hold (nothing is read), and
        CorruptBlock when blocks fail their checksum (they are dropped first; forward its
        `events`). Keep the keys pinned while using the DRAM views returned.
        """
        keys = tuple(keys)
        st = self._state
        with self._lock:
            sources = reads.locate(st, keys, now_s)
            st.pin(keys)
        work = Work()
        bad: list[reads.Source] = []
        try:
            blocks, bad = reads.read(sources, self.block_bytes)
            with self._lock:
                if bad:
                    reads.drop_corrupt(st, bad, now_s, work)
                else:
                    reads.reserve_promotions(st, sources, blocks, now_s, work)
                st.prune_writes(work)
            st.do_io(work)
        finally:
            with self._lock:
                st.settle(work, now_s)
                promoted = tuple(fill[0] for fill in work.fills)
                if promoted:
                    work.events.append(KvStored(now_s, self.instance_id, promoted, Tier.DRAM))
                st.unpin(keys)
            st.remove_files(work)
        if bad:
            raise CorruptBlock(self.instance_id, [source.key for source in bad], work.events)
        return LoadResult(blocks, work.events)

    def evict(self, keys: Iterable[int], now_s: float) -> list[KvEvent]:
        """Drop `keys` from every tier (the Conductor's Evict effect); pinned blocks stay."""
        st = self._state
        work = Work()
        with self._lock:
            removed = []
            for key in dict.fromkeys(keys):
                if key in st.pins:
                    continue
                if key in st.dram.blocks:
                    st.dram.cache.remove(key)
                    st.dram.pop(key)
                elif key in st.ssd.blocks:
                    st.forget_ssd(key, work)
                else:
                    continue
                st.depth.pop(key, None)
                removed.append(key)
            st.counts["evicted"] += len(removed)
            if removed:
                work.events.append(KvEvicted(now_s, self.instance_id, tuple(removed)))
        st.remove_files(work)
        return work.events

    def prefix_length(self, keys: Sequence[int]) -> int:
        """How many leading `keys` the shard holds, in either tier."""
        with self._lock:
            dram, ssd = self._state.dram.blocks, self._state.ssd.blocks
            for num_matched, key in enumerate(keys):
                if key not in dram and key not in ssd:
                    return num_matched
            return len(keys)

    def holdings(self) -> dict[int, Tier]:
        """Every readable block's key and tier."""
        with self._lock:
            held = dict.fromkeys(self._state.ssd.blocks, Tier.SSD)
            held.update(dict.fromkeys(self._state.dram.blocks, Tier.DRAM))
            return held

    def checksum_of(self, key: int) -> int:
        """The block's checksum, to send along with its bytes; MissingBlock if not held."""
        with self._lock:
            dram, ssd = self._state.dram.blocks, self._state.ssd.blocks
            if key in dram:
                return dram[key][1]
            if key in ssd:
                return ssd[key].checksum
        raise MissingBlock(self.instance_id, key)

    def verify(self, key: int, data: Buffer) -> bool:
        """Whether `data` (a copy of the block, e.g. after a transfer) matches its checksum."""
        return checksum(data) == self.checksum_of(key)

    def stats(self) -> ShardStats:
        with self._lock:
            st = self._state
            num_dram, num_ssd = len(st.dram.blocks), len(st.ssd.blocks)
            return ShardStats(
                num_dram_blocks=num_dram,
                dram_bytes=num_dram * self.block_bytes,
                dram_capacity_blocks=st.dram.cache.capacity_blocks or 0,
                num_ssd_blocks=num_ssd,
                ssd_bytes=num_ssd * self.block_bytes,
                ssd_capacity_blocks=st.ssd.cache.capacity_blocks or 0,
                num_pinned_keys=len(st.pins),
                **{f"num_{name}": st.counts[name] for name in _COUNTED},
            )
