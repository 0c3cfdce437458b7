"""How `load` reads blocks: located under the lock, read and checked outside it.

Then, under the lock again, blocks that failed their checksum are dropped and SSD blocks
are promoted back to DRAM.
"""

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import BinaryIO

from agents.pool.integrity import MissingBlock, checksum
from agents.pool.state import ShardState, Work
from agents.pool.tiers import SsdBlock
from backend.policy.events import KvEvicted

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Source:
    """Where one block is read from, and what identifies it if it must be dropped."""

    key: int
    checksum: int
    data: memoryview | bytes | None  # a DRAM slot, or SSD bytes still being written
    slot: int | None = None  # set for a DRAM block
    block: SsdBlock | None = None  # set for an SSD block
    file: BinaryIO | None = None


def locate(state: ShardState, keys: Sequence[int], now_s: float) -> list[Source]:
    """Sources of `keys` (each an access at `now_s`); MissingBlock before touching any."""
    dram, ssd = state.dram, state.ssd
    for key in keys:
        if key not in dram.blocks and key not in ssd.blocks:
            state.counts["misses"] += 1
            raise MissingBlock(state.instance_id, key)
    sources = []
    for key in keys:
        if key in dram.blocks:
            slot, block_sum = dram.blocks[key]
            dram.cache.touch(key, now_s)
            sources.append(Source(key, block_sum, dram.arena.view(slot).toreadonly(), slot=slot))
            state.counts["dram_hits"] += 1
            continue
        block = ssd.blocks[key]
        ssd.cache.touch(key, now_s)
        source = Source(key, block.checksum, block.data, block=block)
        if block.data is None and ssd.files is not None:
            # Opened under the lock: an open file stays readable if the block is removed.
            try:
                source.file = ssd.files.open(block.path)
            except OSError as error:
                logger.warning(
                    "pool shard %s: cannot open %s: %s", state.instance_id, block.path, error
                )
        sources.append(source)
        state.counts["ssd_hits"] += 1
    return sources


def read(
    sources: Sequence[Source], block_bytes: int
) -> tuple[list[memoryview | bytes], list[Source]]:
    """Each source's bytes, and the sources that failed their checksum (or could not be
    read). Closes the files."""
    blocks: list[memoryview | bytes] = []
    bad = []
    try:
        for source in sources:
            data = source.data
            if source.file is not None:
                try:
                    data = source.file.read()
                except OSError:
                    data = None
            if data is None or len(data) != block_bytes or checksum(data) != source.checksum:
                bad.append(source)
            blocks.append(data if data is not None else b"")
    finally:
        for source in sources:
            if source.file is not None:
                source.file.close()
    return blocks, bad


def drop_corrupt(state: ShardState, bad: Sequence[Source], now_s: float, work: Work) -> None:
    """Drop blocks that failed their checksum, unless another call already replaced them."""
    dram, ssd = state.dram, state.ssd
    dropped = []
    for source in bad:
        key = source.key
        if source.block is None and dram.blocks.get(key) == (source.slot, source.checksum):
            state.discard(dram.cache, key)
            dram.pop(key)
        elif source.block is not None and ssd.blocks.get(key) is source.block:
            state.forget_ssd(key, work)
        else:
            continue
        state.depth.pop(key, None)
        dropped.append(key)
    logger.warning(
        "pool shard %s: checksum failed for block(s) %s; dropped",
        state.instance_id, ", ".join(f"{source.key:#x}" for source in bad),
    )  # fmt: skip
    state.counts["corrupt"] += len(bad)
    state.counts["evicted"] += len(dropped)
    if dropped:
        work.events.append(KvEvicted(now_s, state.instance_id, tuple(dropped)))


def reserve_promotions(
    state: ShardState,
    sources: Sequence[Source],
    blocks: Sequence[memoryview | bytes],
    now_s: float,
    work: Work,
) -> None:
    """Reserve DRAM slots for the SSD blocks just read (demoting victims to make room);
    `settle` moves them over once `do_io` has filled the slots."""
    dram = state.dram
    for source, data in zip(sources, blocks, strict=True):
        key = source.key
        if source.block is None or state.ssd.blocks.get(key) is not source.block:
            continue
        if key in dram.cache:
            continue  # another call is storing or promoting it
        stored, evicted = dram.cache.insert(key, now_s, state.depth.get(key, 0))
        state.demote(evicted, now_s, work)
        if stored:
            work.fills.append((key, dram.add_pending(key), memoryview(data), source.checksum))
