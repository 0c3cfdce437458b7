"""The block-hashing benchmark: chained block keys versus one unchained xxh3_64 pass.

The baseline hashes the very same bytes with a single `xxh3_64` call per prompt, which is
the ceiling of what xxhash does on this machine; the ratio shows what chaining (one call
per block) costs on top of it.
"""

import statistics
import time
from dataclasses import dataclass

import numpy as np
import xxhash

from backend.policy.blocks import block_keys

# Token ids are drawn below a LLaMA-sized vocabulary; their values do not change the speed.
_VOCABULARY_SIZE = 128_000


@dataclass(frozen=True, slots=True)
class HashingResult:
    """Median speeds over the repeats, in full-block tokens hashed per second."""

    block_size: int
    num_tokens: int
    num_prompts: int
    num_blocks: int
    num_repeats: int
    tokens_per_s: float
    best_tokens_per_s: float
    baseline_tokens_per_s: float
    ratio: float


def make_prompts(num_tokens: int, num_prompts: int, block_size: int, seed: int) -> list[np.ndarray]:
    """`num_prompts` int32 prompts of varied lengths, each a whole number of blocks.

    Lengths vary (seeded) so the run is not one lucky size; together they hold
    `num_tokens` rounded down to whole blocks.
    """
    if num_prompts <= 0:
        raise ValueError(f"num_prompts must be positive, got {num_prompts}")
    num_blocks = num_tokens // block_size
    if num_blocks < num_prompts:
        raise ValueError(
            f"{num_tokens} tokens make fewer than {num_prompts} blocks of {block_size} tokens"
        )
    rng = np.random.default_rng(seed)
    weights = rng.uniform(0.5, 1.5, size=num_prompts)
    blocks_per_prompt = np.maximum(1, (weights / weights.sum() * num_blocks).astype(np.int64))
    blocks_per_prompt[-1] += num_blocks - int(blocks_per_prompt.sum())
    return [
        rng.integers(0, _VOCABULARY_SIZE, size=int(n) * block_size, dtype=np.int32)
        for n in blocks_per_prompt
    ]


def _chained_s(prompts: list[np.ndarray], block_size: int) -> tuple[float, int]:
    started = time.perf_counter()
    num_blocks = sum(len(block_keys(prompt, block_size)) for prompt in prompts)
    return time.perf_counter() - started, num_blocks


def _unchained_s(prompts: list[np.ndarray]) -> float:
    started = time.perf_counter()
    for prompt in prompts:
        xxhash.xxh3_64_intdigest(memoryview(prompt))
    return time.perf_counter() - started


def measure_hashing(
    *,
    num_tokens: int = 32 * 1024 * 1024,
    block_size: int = 512,
    num_repeats: int = 5,
    num_prompts: int = 8,
    seed: int = 0,
) -> HashingResult:
    """Hash the same prompts `num_repeats` times both ways; speeds are medians."""
    if num_repeats <= 0:
        raise ValueError(f"num_repeats must be positive, got {num_repeats}")
    prompts = make_prompts(num_tokens, num_prompts, block_size, seed)
    hashed_tokens = sum(len(prompt) for prompt in prompts)
    chained_s: list[float] = []
    unchained_s: list[float] = []
    num_blocks = 0
    for _ in range(num_repeats):
        seconds, num_blocks = _chained_s(prompts, block_size)
        chained_s.append(seconds)
        unchained_s.append(_unchained_s(prompts))
    tokens_per_s = hashed_tokens / statistics.median(chained_s)
    baseline_tokens_per_s = hashed_tokens / statistics.median(unchained_s)
    return HashingResult(
        block_size=block_size,
        num_tokens=hashed_tokens,
        num_prompts=len(prompts),
        num_blocks=num_blocks,
        num_repeats=num_repeats,
        tokens_per_s=tokens_per_s,
        best_tokens_per_s=hashed_tokens / min(chained_s),
        baseline_tokens_per_s=baseline_tokens_per_s,
        ratio=tokens_per_s / baseline_tokens_per_s,
    )
