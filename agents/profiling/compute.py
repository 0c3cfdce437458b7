"""Prefill and decode timings of the real torch workers over a ProfileGrid's shapes.

Prefill: one full prefill per prompt length produces its blocks; each cached length then
reuses the first whole blocks through a BlockSource (the worker's KvSource), so load time
is part of the measured total. Decode: a fresh DecodeWorker per cell, `batch` requests of
the same prompt KV joined, then the median of timed steps. Both keep the
fastest of several rounds over the whole grid.
"""

import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from agents.model import LlamaModel, PagedKv, block_shape
from agents.workers.decode import DecodeRequest, DecodeWorker
from agents.workers.kv_io import BlockSource
from agents.workers.prefill import PrefillWorker

OnStep = Callable[[str], None]


def measure_prefill(
    model: LlamaModel,
    cells: Sequence[tuple[int, int]],
    *,
    block_size: int,
    num_repeats: int,
    seed: int = 0,
    on_step: OnStep | None = None,
) -> list[dict[str, float | int]]:
    """Fastest prefill seconds per (input_tokens, offered cached tokens) cell, as points.

    Repeats go round the whole grid rather than cell by cell and the fastest is kept: load
    from elsewhere on the machine only ever adds time, and a burst of it then has to last
    all the rounds to skew a cell.
    """
    worker = PrefillWorker(model, block_size)
    rng = np.random.default_rng(seed)
    prompts = {}
    for input_tokens in sorted({inputs for inputs, _ in cells}):  # also warms up
        tokens = rng.integers(0, model.config.vocab_size, input_tokens)
        prompts[input_tokens] = (tokens, worker.prefill(tokens).new_blocks)
    times: dict[tuple[int, int], list[float]] = {cell: [] for cell in cells}
    cached: dict[tuple[int, int], int] = {}
    for repeat in range(num_repeats):
        for cell in cells:
            inputs, offered = cell
            tokens, blocks = prompts[inputs]
            source = BlockSource(blocks[: offered // block_size]) if offered else None
            result = worker.prefill(tokens, source=source)
            times[cell].append(result.timings.total_s)
            cached[cell] = result.num_cached_tokens
            if on_step is not None:
                on_step(
                    f"prefill {inputs} tokens, {cached[cell]} cached ({repeat + 1}/{num_repeats})"
                )
    return [
        {
            "input_tokens": inputs,
            "cached_tokens": cached[(inputs, offered)],
            "seconds": min(times[(inputs, offered)]),
        }
        for inputs, offered in cells
    ]


def synthetic_kv(model: LlamaModel, context_tokens: int, block_size: int) -> PagedKv:
    """Random prompt KV of `context_tokens`: a decode step's time does not depend on values."""
    num_blocks = -(-context_tokens // block_size)
    generator = torch.Generator().manual_seed(0)
    shape = block_shape(model.config, block_size)
    blocks = tuple(
        torch.randn(shape, generator=generator).to(model.device, model.dtype)
        for _ in range(num_blocks)
    )
    return PagedKv(blocks, context_tokens, block_size)


def time_decode_step(model: LlamaModel, kv: PagedKv, batch_size: int, num_steps: int) -> float:
    """Median seconds of a decode step of `batch_size` requests over `kv` each."""
    worker = DecodeWorker(model, max_batch_size=batch_size)
    for index in range(batch_size):
        worker.submit(DecodeRequest(f"r{index}", kv, 1, max_tokens=num_steps + 2))
    worker.step()  # joins every request and runs the first step
    times = []
    for _ in range(num_steps):
        started_s = time.perf_counter()
        worker.step()
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
        times.append(time.perf_counter() - started_s)
    return statistics.median(times)


def measure_decode(
    model: LlamaModel,
    cells: Sequence[tuple[int, int]],
    *,
    block_size: int,
    num_rounds: int,
    num_steps: int,
    on_step: OnStep | None = None,
) -> list[dict[str, float | int]]:
    """Step seconds per (batch_size, context per request) cell, as profile points whose
    context_tokens is the batch's total context (what the twin and the policy use).

    Each round times every cell (median of `num_steps` steps); the fastest round is kept,
    for the reason given in measure_prefill.
    """
    time_decode_step(model, synthetic_kv(model, block_size, block_size), 1, 2)  # warm-up
    contexts = sorted({context for _, context in cells})
    kvs = {context: synthetic_kv(model, context, block_size) for context in contexts}
    times: dict[tuple[int, int], list[float]] = {cell: [] for cell in cells}
    for round_index in range(num_rounds):
        for cell in cells:
            batch_size, context = cell
            times[cell].append(time_decode_step(model, kvs[context], batch_size, num_steps))
            if on_step is not None:
                on_step(
                    f"decode batch {batch_size} x {context} tokens ({round_index + 1}/{num_rounds})"
                )
    return [
        {
            "batch_size": batch_size,
            "context_tokens": batch_size * context,
            "context_per_request_tokens": context,
            "seconds": min(times[(batch_size, context)]),
        }
        for batch_size, context in cells
    ]
