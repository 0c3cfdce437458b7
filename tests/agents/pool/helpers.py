"""Builders shared by the pool shard tests: shards, deterministic block bytes, event replay."""

import random
from collections.abc import Iterable
from pathlib import Path

from agents.pool import KvEvent, KvPoolShard
from backend.policy import PrefixIndex
from tests.kv_events import replay_kv_events

BLOCK_BYTES = 256


def block_of(key: int, block_bytes: int = BLOCK_BYTES) -> bytes:
    """The bytes every test stores under `key`, so any read can be checked exactly."""
    return random.Random(key).randbytes(block_bytes)


def make_shard(
    dram_blocks: int,
    *,
    ssd_dir: Path | None = None,
    ssd_blocks: int = 0,
    policy: str = "lru",
) -> KvPoolShard:
    return KvPoolShard(
        "prefill-00",
        block_bytes=BLOCK_BYTES,
        dram_capacity_bytes=dram_blocks * BLOCK_BYTES,
        ssd_dir=ssd_dir,
        ssd_capacity_bytes=ssd_blocks * BLOCK_BYTES,
        eviction_policy=policy,
    )


def store(shard: KvPoolShard, keys: list[int], now_s: float, first_depth: int = 0):
    return shard.store(keys, [block_of(key) for key in keys], now_s, first_depth)


def replay(index: PrefixIndex, events: Iterable[KvEvent]) -> None:
    """Feed shard events to the Conductor's index exactly as the core does."""
    replay_kv_events(index, events)


def ssd_files(root: Path) -> list[Path]:
    return sorted(path for path in root.iterdir() if path.suffix == ".kv")
