"""DramTier and SsdTier: what each tier of a shard holds (keys in policy order, and bytes).

Plain state, no locking and no events: the shard changes them under its lock and emits the
KV events. A key is in a tier's BlockCache exactly when it is in that tier's block map (or,
for DRAM, pending: its slot is being filled outside the lock).
"""

import itertools
from dataclasses import dataclass
from pathlib import Path

from agents.pool.arena import SlotArena
from agents.pool.ssd_files import SsdDir
from backend.policy.block_cache import BlockCache


class DramTier:
    """Up to `capacity_blocks` blocks in a SlotArena, evicted in `policy` order."""

    def __init__(self, capacity_blocks: int, block_bytes: int, policy: str) -> None:
        self.cache = BlockCache(capacity_blocks, policy)
        self.arena = SlotArena(capacity_blocks, block_bytes)
        self.blocks: dict[int, tuple[int, int]] = {}  # readable: key -> (slot, checksum)
        self.pending: dict[int, int] = {}  # being filled: key -> slot

    def add_pending(self, key: int) -> int:
        slot = self.arena.alloc()
        self.pending[key] = slot
        return slot

    def publish(self, key: int, checksum: int) -> None:
        self.blocks[key] = (self.pending.pop(key), checksum)

    def pop(self, key: int) -> None:
        """Forget a readable block and free its slot (its key is already out of the cache)."""
        slot, _ = self.blocks.pop(key)
        self.arena.free(slot)


@dataclass(slots=True, eq=False)
class SsdBlock:
    """A block on the SSD tier; `data` holds its bytes until its file is written."""

    path: Path
    checksum: int
    data: bytes | None


class SsdTier:
    """Up to `capacity_blocks` blocks as files in `files` (no tier when capacity is 0)."""

    def __init__(self, capacity_blocks: int, policy: str, files: SsdDir | None) -> None:
        self.cache = BlockCache(capacity_blocks, policy)
        self.files = files
        self.blocks: dict[int, SsdBlock] = {}
        self._generation = itertools.count()

    @property
    def exists(self) -> bool:
        return self.files is not None

    def add(self, key: int, checksum: int, data: bytes) -> SsdBlock:
        assert self.files is not None, "no SSD tier: its BlockCache has capacity 0"
        block = SsdBlock(self.files.path_for(key, next(self._generation)), checksum, data)
        self.blocks[key] = block
        return block

    def pop(self, key: int) -> Path | None:
        """Forget a block; returns its file to remove, or None while its write is in flight
        (the writer sees the block is gone and removes the file itself)."""
        block = self.blocks.pop(key)
        return block.path if block.data is None else None
