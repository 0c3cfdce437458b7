"""The node's KV pool shard: block bytes in a DRAM arena and an SSD directory, checksummed.

Module map: `shard` (KvPoolShard, the public API and its locking), `state` (bookkeeping and
moves between tiers), `reads` (how a load reads, checks and promotes), `tiers` (what each
tier holds), `arena` (DRAM slots), `ssd_files` (atomic block files), `integrity` (checksum
and errors), `results` (what calls return), `bench` (store/load times per tier).
"""

from agents.pool.integrity import CorruptBlock, KvEvent, MissingBlock, checksum
from agents.pool.results import LoadResult, ShardStats, StoreResult
from agents.pool.shard import KvPoolShard

__all__ = [
    "CorruptBlock",
    "KvEvent",
    "KvPoolShard",
    "LoadResult",
    "MissingBlock",
    "ShardStats",
    "StoreResult",
    "checksum",
]
