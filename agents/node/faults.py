"""Test-only fault injection: off unless the agent starts with KVC_FAULT_CORRUPT_FETCH=1.

With it set, every batch the agent serves over the data plane has one byte of its last
block flipped while the block's stored checksum goes out unchanged, as if the bytes were
damaged in a holder's memory or on the wire. The end-to-end tests use it to check that a
requester detects the damage and recomputes the block. Never set it in production.
"""

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from agents.transport import SourceBatch

logger = logging.getLogger(__name__)

CORRUPT_FETCH_ENV = "KVC_FAULT_CORRUPT_FETCH"

Source = Callable[[Sequence[int]], SourceBatch]


@dataclass(frozen=True, slots=True)
class Faults:
    corrupt_fetch: bool = False

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> "Faults":
        faults = cls(corrupt_fetch=environ.get(CORRUPT_FETCH_ENV) == "1")
        if faults.corrupt_fetch:
            logger.warning("%s=1: served blocks are corrupted (test only)", CORRUPT_FETCH_ENV)
        return faults


def corrupting_last_block(serve: Source) -> Source:
    """`serve` with one byte of each batch's last block flipped; checksums left as stored."""

    def corrupted(keys: Sequence[int]) -> SourceBatch:
        batch = serve(keys)
        blocks = list(batch.blocks)
        if blocks:
            damaged = bytearray(blocks[-1])
            damaged[len(damaged) // 2] ^= 0xFF
            blocks[-1] = damaged
        return SourceBatch(blocks, batch.checksums, batch.release)

    return corrupted
