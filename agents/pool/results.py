"""What a shard's calls return: store and load results and the shard's statistics."""

from dataclasses import dataclass

from agents.pool.integrity import KvEvent


@dataclass(frozen=True, slots=True)
class StoreResult:
    """KV events of a store, and the keys left out because every other block is pinned.

    Refused blocks are not held anywhere in the shard (the deepest of the prompt go first,
    as a block is only reusable behind its whole prefix).
    """

    events: list[KvEvent]
    refused_keys: tuple[int, ...]

    @property
    def is_complete(self) -> bool:
        return not self.refused_keys


@dataclass(frozen=True, slots=True)
class LoadResult:
    """The blocks' bytes, in key order, and the KV events of promoting SSD blocks to DRAM.

    A DRAM block comes back as a read-only memoryview of its slot (no copy): valid while
    the caller keeps the block pinned. An SSD block comes back as `bytes`.
    """

    blocks: list[memoryview | bytes]
    events: list[KvEvent]


@dataclass(frozen=True, slots=True)
class ShardStats:
    """Blocks and bytes per tier, and counts since the shard started.

    `num_stored` counts blocks that entered the shard; each leaves only through
    `num_evicted` (dropped from every tier, corrupt ones included), so
    num_stored - num_evicted == num_dram_blocks + num_ssd_blocks once calls have returned.
    """

    num_dram_blocks: int
    dram_bytes: int
    dram_capacity_blocks: int
    num_ssd_blocks: int
    ssd_bytes: int
    ssd_capacity_blocks: int
    num_pinned_keys: int
    num_stored: int
    num_refused: int
    num_dram_hits: int
    num_ssd_hits: int
    num_misses: int
    num_evicted: int
    num_demoted: int
    num_promoted: int
    num_corrupt: int
    num_ssd_write_errors: int
