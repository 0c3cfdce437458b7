"""Block keys: the chained xxh3_64 hash that names a block of tokens and its whole prefix.

key_i = xxh3_64(key_{i-1} as 8 little-endian bytes || block i's token ids as int32 LE),
key_{-1} = 0. Only full blocks get keys, so a prompt of n tokens has n // block_size keys.
Equal keys imply equal prefixes, which makes a longest-prefix match a walk over keys.
"""

from collections.abc import Sequence

import numpy as np
import xxhash

_LE_INT32 = np.dtype("<i4")


def num_full_blocks(num_tokens: int, block_size: int) -> int:
    """How many whole blocks of `block_size` tokens fit in `num_tokens`."""
    return num_tokens // block_size


def block_keys(
    token_ids: Sequence[int] | np.ndarray | bytes | memoryview,
    block_size: int,
    parent_key: int = 0,
) -> list[int]:
    """Chained keys of every full block of `token_ids`.

    `token_ids` may be an int32 numpy array (fastest: no conversion), any sequence of ints,
    or raw int32 little-endian bytes. `parent_key` continues a chain (the key of the block
    before the first one given), so a prompt can be hashed in pieces.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if isinstance(token_ids, bytes | memoryview):
        raw = memoryview(token_ids).cast("B")
        if len(raw) % 4:
            raise ValueError("raw token bytes must be a whole number of int32 values")
    else:
        array = np.ascontiguousarray(token_ids, dtype=_LE_INT32)
        raw = memoryview(array).cast("B")
    block_bytes = block_size * 4
    num_blocks = len(raw) // block_bytes
    keys: list[int] = []
    key = parent_key
    hasher = xxhash.xxh3_64()
    for start in range(0, num_blocks * block_bytes, block_bytes):
        hasher.reset()
        hasher.update(key.to_bytes(8, "little"))
        hasher.update(raw[start : start + block_bytes])
        key = hasher.intdigest()
        keys.append(key)
    return keys
