"""Block checksums and the errors a shard raises for blocks it cannot serve.

The checksum is xxh3_64 of a block's bytes: kept for every stored block, checked on every
read, and offered to the data plane so a receiver can check a block after a transfer.
"""

from collections.abc import Sequence

import xxhash

from backend.policy.events import KvDemoted, KvEvicted, KvStored

KvEvent = KvStored | KvEvicted | KvDemoted


def checksum(data: bytes | bytearray | memoryview) -> int:
    """xxh3_64 of `data` (any contiguous buffer), as an unsigned int."""
    return xxhash.xxh3_64_intdigest(data)


class MissingBlock(KeyError):
    """A block the shard does not hold was asked for (dispatched on a stale index)."""

    def __init__(self, instance_id: str, key: int) -> None:
        super().__init__(key)
        self.instance_id = instance_id
        self.key = key

    def __str__(self) -> str:
        return f"pool shard {self.instance_id} does not hold block {self.key:#x}"


class CorruptBlock(Exception):
    """Blocks whose bytes failed their checksum; the shard dropped them, so recompute them.

    `events` are the KV events the drop caused (a KvEvicted naming `keys`); forward them to
    the Conductor like any other shard events.
    """

    def __init__(self, instance_id: str, keys: Sequence[int], events: Sequence[KvEvent]) -> None:
        names = ", ".join(f"{key:#x}" for key in keys)
        super().__init__(f"pool shard {instance_id}: checksum failed for block(s) {names}")
        self.instance_id = instance_id
        self.keys = tuple(keys)
        self.events = list(events)
