"""The data plane's frame format: kinds, header, sections, limits and the block checksum.

A frame is `header | keys | meta | payload | checksums`: the 32-byte header says which
sections follow and how long they are, keys are little-endian u64, `meta` is a short
UTF-8/JSON note (error text, a Mooncake lease), the payload is the blocks back to back and
the checksums (xxh3_64 per block) trail it, so a sender can hash each block just before
sending it and a receiver just after receiving it. A header is checked against
`FrameLimits` before anything it announces is allocated.
"""

import enum
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

from agents.transport.errors import FrameTooLargeError, TransportError

Buffer = bytes | bytearray | memoryview

MAGIC = b"KVT1"
# magic, kind, num_blocks, meta_bytes, block_bytes, request_id
HEADER = struct.Struct("<4sBxxxIIQQ")


class Kind(enum.IntEnum):
    FETCH = 1  # keys                      -> BLOCKS, LEASE or an error
    BLOCKS = 2  # keys, payload, checksums
    PUSH = 3  # keys, payload, checksums   -> ACK or an error
    ACK = 4
    ERR_MISSING = 5  # keys the source does not hold, meta = detail
    ERR_CORRUPT = 6  # keys whose checksum failed, meta = detail
    ERR_REMOTE = 7  # meta = what the peer's source/sink raised
    LEASE = 8  # keys, checksums, meta = where to read/write them (Mooncake)
    RELEASE = 9  # request_id = lease to drop (Mooncake), no reply
    PUSH_BEGIN = 10  # keys, checksums      -> LEASE of a receive region (Mooncake)
    PUSH_COMMIT = 11  # request_id = lease  -> ACK or an error (Mooncake)


PAYLOAD_KINDS = frozenset({Kind.BLOCKS, Kind.PUSH})
CHECKSUM_KINDS = frozenset({Kind.BLOCKS, Kind.PUSH, Kind.LEASE, Kind.PUSH_BEGIN})


@dataclass(frozen=True, slots=True)
class FrameLimits:
    """What one incoming frame may announce; checked before anything is allocated."""

    max_blocks: int = 1 << 16
    max_block_bytes: int = 64 << 20
    max_batch_bytes: int = 1 << 30
    max_meta_bytes: int = 64 << 10

    def __post_init__(self) -> None:
        for name in ("max_blocks", "max_block_bytes", "max_batch_bytes", "max_meta_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class Frame:
    """One received frame; `payload` is the blocks back to back, `bad_keys` failed checksums."""

    kind: Kind
    request_id: int
    keys: tuple[int, ...]
    block_bytes: int
    meta: bytes
    payload: memoryview | None
    checksums: tuple[int, ...]
    bad_keys: tuple[int, ...]

    def blocks(self) -> list[memoryview]:
        """The payload cut into one view per block (no copy)."""
        if self.payload is None:
            return []
        size = self.block_bytes
        return [self.payload[i * size : (i + 1) * size] for i in range(len(self.keys))]


def checksum(block: Buffer) -> int:
    """xxh3_64 of a block's bytes, the checksum the pool keeps for every block."""
    return xxhash.xxh3_64_intdigest(block)


def pack_u64s(values: Sequence[int]) -> bytes:
    try:
        return struct.pack(f"<{len(values)}Q", *values)
    except struct.error as exc:
        raise ValueError(f"block keys and checksums must be unsigned 64-bit ints: {exc}") from exc


def check_limits(kind: Kind, num: int, meta: int, size: int, limits: FrameLimits, peer: str):
    if num > limits.max_blocks or meta > limits.max_meta_bytes:
        raise FrameTooLargeError(
            peer,
            f"{kind.name} frame announces {num} blocks and {meta} meta bytes "
            f"(limits {limits.max_blocks} and {limits.max_meta_bytes})",
        )
    if kind in PAYLOAD_KINDS and num and not size:
        raise TransportError(peer, f"{kind.name} frame announces {num} blocks of 0 bytes")
    if size and (size > limits.max_block_bytes or num * size > limits.max_batch_bytes):
        raise FrameTooLargeError(
            peer,
            f"{kind.name} frame announces {num} blocks of {size} bytes (limits "
            f"{limits.max_block_bytes} per block, {limits.max_batch_bytes} per batch)",
        )
