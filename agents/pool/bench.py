"""Store and load times per block for each tier of a KvPoolShard, at a given block size.

For a model preset the block is num_layers x 2 (K, V) x num_kv_heads x block_size x
head_dim x dtype bytes (`ModelConfig.block_bytes`); the tiny preset's 16-token fp32 block
is 32 KiB. Times are wall-clock on this machine, SSD files in `ssd_root` (the system
temporary directory unless given), fsync included.
"""

import itertools
import os
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from agents.pool.integrity import checksum
from agents.pool.shard import KvPoolShard


def bench_pool(
    block_bytes: int,
    *,
    num_blocks: int = 64,
    num_blocks_per_call: int = 8,
    ssd_root: Path | None = None,
    seed: int = 0,
) -> dict[str, float]:
    """Per-block microseconds of: a DRAM store, a DRAM load (zero-copy view, checksum
    checked), a store into a full DRAM tier that demotes one block to SSD, an SSD load
    (read from the device, the page cache dropped first, and checked; DRAM pinned full so
    nothing is promoted) and an SSD load promoting
    into DRAM (which demotes another block); plus the checksum's GB/s."""
    rng = random.Random(seed)
    blocks = [rng.randbytes(block_bytes) for _ in range(2 * num_blocks)]
    first = list(range(1, num_blocks + 1))
    second = list(range(num_blocks + 1, 2 * num_blocks + 1))
    with tempfile.TemporaryDirectory(dir=ssd_root, prefix="kvcentric-pool-bench-") as root:
        shard = KvPoolShard(
            "bench",
            block_bytes=block_bytes,
            dram_capacity_bytes=num_blocks * block_bytes,
            ssd_dir=Path(root),
            ssd_capacity_bytes=2 * num_blocks * block_bytes,
        )

        def per_block(keys: list[int], call: Callable[[list[int], int], object]) -> float:
            start = time.perf_counter()
            for at in range(0, len(keys), num_blocks_per_call):
                call(keys[at : at + num_blocks_per_call], at)
            return (time.perf_counter() - start) / len(keys) * 1e6

        ticks = itertools.count(1)  # each call at a time of its own, as in real traffic

        def store(keys: list[int], at: int) -> object:
            offset = keys[0] - 1
            return shard.store(keys, blocks[offset : offset + len(keys)], float(next(ticks)), at)

        def load(keys: list[int], at: int) -> object:
            return shard.load(keys, float(next(ticks)))

        figures = {"block_bytes": float(block_bytes), "num_blocks": float(num_blocks)}
        figures["dram_store_us_per_block"] = per_block(first, store)
        figures["dram_load_us_per_block"] = per_block(first, load)
        figures["ssd_demote_us_per_block"] = per_block(second, store)
        _drop_page_cache(Path(root))
        shard.pin(second)
        figures["ssd_load_us_per_block"] = per_block(first, load)
        shard.unpin(second)
        figures["ssd_promote_us_per_block"] = per_block(first, load)
        stats = shard.stats()
        assert stats.num_corrupt == 0 and stats.num_promoted == num_blocks, stats
    data = blocks[0]
    start = time.perf_counter()
    for _ in range(20):
        checksum(data)
    figures["checksum_gb_per_s"] = 20 * block_bytes / (time.perf_counter() - start) / 1e9
    return figures


def _drop_page_cache(root: Path) -> None:
    """Evict the (fsynced, so clean) block files from the page cache, so SSD loads read the
    device; a no-op where posix_fadvise does not exist."""
    advise = getattr(os, "posix_fadvise", None)
    for path in root.glob("*.kv"):
        with path.open("rb") as file:
            if advise is not None:
                advise(file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
