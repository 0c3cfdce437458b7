"""Real token ids for a trace row: each block's tokens drawn from its hash id alone.

Requests that share their first k hash ids therefore share their first k blocks of tokens
exactly, so the chained block keys of `backend.policy.blocks` agree exactly where the trace
says the prefixes agree and differ after.
"""

from collections.abc import Sequence

import numpy as np

from backend.traces.loader import TRACE_BLOCK_SIZE, TraceRow

DEFAULT_VOCAB_SIZE = 32_000


def trace_token_ids(
    row: TraceRow | tuple[Sequence[int], int],
    *,
    block_size: int = TRACE_BLOCK_SIZE,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    length_scale: float = 1.0,
) -> np.ndarray:
    """Token ids (int32, each in [0, vocab_size)) of a row or of `(hash_ids, input_length)`.

    `block_size` is the trace's block size (512 for Mooncake traces). With the default
    `length_scale=1` the result has exactly `input_length` tokens and the last block is cut
    to what `input_length` requires. A `length_scale` s in (0, 1] shrinks the prompt for
    small machines while keeping prefix sharing exact: every trace block becomes
    round(block_size * s) tokens (at least 1) and the partial last block is scaled the same
    way, so the length is about s * input_length (see `scaled_input_tokens`). Choose s so
    that the scaled block is a multiple of the serving block size if block keys must line
    up with trace blocks.
    """
    hash_ids, input_length = _ids_and_length(row)
    _check(hash_ids, input_length, block_size, vocab_size, length_scale)
    num_tokens = scaled_input_tokens(input_length, block_size=block_size, length_scale=length_scale)
    scaled_block_size = _scaled_block_size(block_size, length_scale)
    return _block_tokens(hash_ids, scaled_block_size, vocab_size).reshape(-1)[:num_tokens]


def scaled_input_tokens(
    input_length: int, *, block_size: int = TRACE_BLOCK_SIZE, length_scale: float = 1.0
) -> int:
    """How many tokens `trace_token_ids` returns for a prompt of `input_length` tokens."""
    if length_scale == 1.0:
        return input_length
    scaled_block_size = _scaled_block_size(block_size, length_scale)
    num_full_blocks, last_block_tokens = divmod(input_length, block_size)
    scaled_last_tokens = 0
    if last_block_tokens:
        scaled_last_tokens = min(scaled_block_size, max(1, round(last_block_tokens * length_scale)))
    return num_full_blocks * scaled_block_size + scaled_last_tokens


def _scaled_block_size(block_size: int, length_scale: float) -> int:
    return max(1, round(block_size * length_scale))


# SplitMix64's constants (Steele, Lea and Flood, "Fast splittable pseudorandom number
# generators", OOPSLA 2014): its finalizer turns consecutive integers into well-mixed ones.
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_ID_MASK = (1 << 64) - 1


def _block_tokens(hash_ids: Sequence[int], num_tokens: int, vocab_size: int) -> np.ndarray:
    """A (blocks, num_tokens) int32 array: row k holds the tokens of block `hash_ids[k]`,
    drawn from that id alone (SplitMix64 over the id and the position), so a block's tokens
    do not depend on the request it is in. All blocks at once: a NumPy generator seeded per
    block cost the Conductor about 0.5 ms of CPU a request, 15 % of its HTTP thread."""
    ids = np.array([int(hash_id) & _ID_MASK for hash_id in hash_ids], dtype=np.uint64)
    positions = np.arange(1, num_tokens + 1, dtype=np.uint64)
    state = _mix(_mix(ids) + _GOLDEN)[:, None] + positions[None, :] * _GOLDEN
    return (_mix(state) % np.uint64(vocab_size)).astype(np.int32)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer, elementwise (uint64 arithmetic wraps, as it must)."""
    z = (z ^ (z >> np.uint64(30))) * _MIX_1
    z = (z ^ (z >> np.uint64(27))) * _MIX_2
    return z ^ (z >> np.uint64(31))


def _ids_and_length(row: TraceRow | tuple[Sequence[int], int]) -> tuple[Sequence[int], int]:
    if isinstance(row, TraceRow):
        return row.hash_ids, row.input_length
    hash_ids, input_length = row
    return hash_ids, input_length


def _check(
    hash_ids: Sequence[int],
    input_length: int,
    block_size: int,
    vocab_size: int,
    length_scale: float,
) -> None:
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    if not 0 < length_scale <= 1:
        raise ValueError(f"length_scale must be in (0, 1], got {length_scale}")
    num_blocks_needed = -(-input_length // block_size)
    if input_length < 0 or len(hash_ids) != num_blocks_needed:
        raise ValueError(
            f"{len(hash_ids)} hash ids do not fit input_length {input_length} "
            f"(needs {num_blocks_needed} blocks of {block_size} tokens)"
        )
