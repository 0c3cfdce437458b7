"""ShardState: a pool shard's bookkeeping and the moves between its tiers.

Everything here but `do_io` and `remove_files` runs under the shard's lock. A call gathers
its slow parts in a `Work` (memcpy into reserved DRAM slots, SSD writes, file removals),
runs them outside the lock with `do_io`, then `settle`s them under the lock again.
"""

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agents.pool.integrity import KvEvent
from agents.pool.ssd_files import SsdDir
from agents.pool.tiers import DramTier, SsdBlock, SsdTier
from backend.policy.block_cache import BlockCache
from backend.policy.events import KvDemoted, KvEvicted

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Work:
    """One call's events so far and its slow parts, done outside the lock."""

    events: list[KvEvent] = field(default_factory=list)
    fills: list[tuple[int, int, memoryview, int]] = field(
        default_factory=list
    )  # key, slot, bytes, checksum
    writes: list[tuple[int, SsdBlock]] = field(default_factory=list)
    failures: list[tuple[int, SsdBlock, OSError]] = field(default_factory=list)
    removals: list[Path] = field(default_factory=list)
    is_done: bool = False  # do_io finished (else settle rolls the fills back)


class ShardState:
    """The tiers, pins, depths and counts of one shard (not thread-safe by itself)."""

    def __init__(self, instance_id: str, dram: DramTier, ssd: SsdTier) -> None:
        self.instance_id = instance_id
        self.dram = dram
        self.ssd = ssd
        self.pins: dict[int, int] = {}
        self.depth: dict[int, int] = {}  # position in its prompt, for length-aware order
        self.counts: Counter[str] = Counter()

    # -- pins -----------------------------------------------------------------------------
    def pin(self, keys: Sequence[int]) -> None:
        for key in keys:
            self.pins[key] = self.pins.get(key, 0) + 1
        self.dram.cache.pin(keys)
        self.ssd.cache.pin(keys)

    def unpin(self, keys: Sequence[int]) -> None:
        for key in keys:
            count = self.pins.get(key, 0)
            if count <= 1:
                self.pins.pop(key, None)
            else:
                self.pins[key] = count - 1
        self.dram.cache.unpin(keys)
        self.ssd.cache.unpin(keys)

    def discard(self, cache: BlockCache, key: int) -> None:
        """Remove `key` from `cache` even when pinned (a promoted or corrupt block)."""
        num_pins = self.pins.get(key, 0)
        cache.unpin([key] * num_pins)
        cache.remove(key)
        cache.pin([key] * num_pins)

    def forget_ssd(self, key: int, work: Work) -> None:
        """Drop an SSD block (pinned or not) and schedule its file's removal."""
        self.discard(self.ssd.cache, key)
        path = self.ssd.pop(key)
        if path is not None:
            work.removals.append(path)

    # -- demotion -------------------------------------------------------------------------
    def demote(self, victims: Sequence[int], now_s: float, work: Work) -> None:
        """Move DRAM victims (already out of the DRAM cache) to SSD, or drop them."""
        if not victims:
            return
        dram, ssd = self.dram, self.ssd
        demoted: list[int] = []
        pushed_out: list[int] = []
        num_refused = 0
        for key in victims:
            slot, block_sum = dram.blocks.pop(key)
            stored, evicted = ssd.cache.insert(key, now_s, self.depth.get(key, 0))
            pushed_out.extend(evicted)
            if stored:
                # Copied under the lock: the slot goes to a new block at once.
                block = ssd.add(key, block_sum, bytes(dram.arena.view(slot)))
                work.writes.append((key, block))
                demoted.append(key)
            else:
                num_refused += 1
            dram.arena.free(slot)
        for key in pushed_out:
            path = ssd.pop(key)
            if path is not None:
                work.removals.append(path)
        dropped = list(dict.fromkeys(k for k in (*pushed_out, *victims) if k not in ssd.cache))
        demoted = [key for key in demoted if key in ssd.cache]
        for key in dropped:
            self.depth.pop(key, None)
        if ssd.exists and num_refused:
            logger.warning(
                "pool shard %s: SSD tier full of pinned blocks; dropped %d demoted block(s)",
                self.instance_id, num_refused,
            )  # fmt: skip
        self.counts["evicted"] += len(dropped)
        self.counts["demoted"] += len(demoted)
        if dropped:
            work.events.append(KvEvicted(now_s, self.instance_id, tuple(dropped)))
        if demoted:
            work.events.append(KvDemoted(now_s, self.instance_id, tuple(demoted)))

    def prune_writes(self, work: Work) -> None:
        """Leave out writes of blocks already gone again (pushed out by a later victim)."""
        blocks = self.ssd.blocks
        work.writes = [(key, block) for key, block in work.writes if blocks.get(key) is block]

    # -- outside the lock -----------------------------------------------------------------
    def do_io(self, work: Work) -> None:
        """Fill reserved DRAM slots and write demoted blocks; failed writes go to failures."""
        for _, slot, data, _ in work.fills:
            self.dram.arena.write(slot, data)
        files = self.ssd.files
        written = []
        for key, block in work.writes:
            assert files is not None and block.data is not None
            try:
                files.write(block.path, block.data)
            except OSError as error:
                work.failures.append((key, block, error))
            else:
                written.append((key, block))
        work.writes = written
        work.is_done = True

    @staticmethod
    def remove_files(work: Work) -> None:
        for path in work.removals:
            SsdDir.remove(path)
        work.removals.clear()

    # -- settling -------------------------------------------------------------------------
    def settle(self, work: Work, now_s: float) -> None:
        """Publish filled DRAM slots (promotions leave SSD) and finish SSD writes."""
        dram, ssd = self.dram, self.ssd
        if not work.is_done:
            self._roll_back(work)
        for key, _, _, block_sum in work.fills:
            dram.publish(key, block_sum)
            if key in ssd.blocks:
                self.forget_ssd(key, work)
                self.counts["promoted"] += 1
            else:
                self.counts["stored"] += 1
        for key, block in work.writes:
            if ssd.blocks.get(key) is block:
                block.data = None
            else:
                work.removals.append(block.path)  # promoted or dropped while being written
        dropped = []
        for key, block, error in work.failures:
            logger.warning(
                "pool shard %s: cannot write block %#x to SSD (%s); dropped it",
                self.instance_id, key, error,
            )  # fmt: skip
            if ssd.blocks.get(key) is block:
                self.discard(ssd.cache, key)
                del ssd.blocks[key]
                self.depth.pop(key, None)
                dropped.append(key)
        self.counts["ssd_write_errors"] += len(work.failures)
        self.counts["evicted"] += len(dropped)
        if dropped:
            work.events.append(KvEvicted(now_s, self.instance_id, tuple(dropped)))
        work.failures.clear()

    def _roll_back(self, work: Work) -> None:
        """A call failed before its I/O was done: free its reserved slots, drop its writes."""
        for key, slot, _, _ in work.fills:
            del self.dram.pending[key]
            self.dram.arena.free(slot)
            self.discard(self.dram.cache, key)
        work.fills.clear()
        work.failures.extend((key, block, OSError("never written")) for key, block in work.writes)
        work.writes.clear()
        work.is_done = True
