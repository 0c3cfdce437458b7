"""Worker speed benchmarks: prefill with a reused prefix vs none, and decode step times.

Both use every core for torch (no I/O thread runs beside them) unless told otherwise.
"""

import dataclasses
import statistics
from typing import Any

import numpy as np

from agents.bench.threads import compute_threads, torch_threads
from agents.model import build_model
from agents.profiling.compute import synthetic_kv, time_decode_step
from agents.workers.kv_io import BlockSource
from agents.workers.prefill import PrefillWorker
from backend.policy.cost_model import fit_decode


def prefix_reuse_benchmark(
    preset: str = "tiny",
    context_tokens: int = 4096,
    *,
    cached_share: float = 0.75,
    block_size: int = 64,
    num_repeats: int = 3,
    num_threads: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Prefill time of a prompt with `cached_share` of it reused vs computed from scratch.

    The reused blocks come from an earlier full prefill of the same prompt and are loaded
    from host memory layer by layer. Returns cold_s, warm_s (medians), ratio = warm / cold,
    speedup = cold / warm, and flops_ratio, what the FLOP count alone predicts for ratio.
    """
    if not 0 <= cached_share < 1:
        raise ValueError(f"cached_share must be in [0, 1), got {cached_share}")
    with torch_threads(num_threads or compute_threads()) as threads:
        model = build_model(preset, seed=seed, device="cpu")
        worker = PrefillWorker(model, block_size)
        tokens = np.random.default_rng(seed).integers(0, model.config.vocab_size, context_tokens)
        full = worker.prefill(tokens)  # also the warm-up
        cached_blocks = int(context_tokens * cached_share) // block_size
        cold, warm = [], []
        for _ in range(num_repeats):
            cold.append(worker.prefill(tokens).timings.total_s)
            source = BlockSource(full.new_blocks[:cached_blocks])
            warm.append(worker.prefill(tokens, source=source).timings.total_s)
    cold_s, warm_s = statistics.median(cold), statistics.median(warm)
    cached_tokens = cached_blocks * block_size
    config = model.config
    return {
        "preset": preset,
        "context_tokens": context_tokens,
        "cached_tokens": cached_tokens,
        "block_size": block_size,
        "torch_threads": threads,
        "num_repeats": num_repeats,
        "cold_s": cold_s,
        "warm_s": warm_s,
        "ratio": warm_s / cold_s,
        "speedup": cold_s / warm_s,
        "flops_ratio": config.prefill_flops(context_tokens, cached_tokens)
        / config.prefill_flops(context_tokens),
    }


def decode_benchmark(
    preset: str = "tiny",
    *,
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64),
    context_tokens: tuple[int, ...] = (256, 1024, 4096),
    num_steps: int = 10,
    block_size: int = 64,
    num_threads: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Decode step time over batch sizes and per-request context lengths.

    Every cell starts a fresh worker with `batch` requests of `context` prompt tokens,
    lets them join, then times `num_steps` steps (median). Returns the grid as `points`
    (batch_size, context_tokens per request, step_s, tokens_per_s) and the policy cost
    model's decode fit over them (its context is the batch's total context; None
    with fewer than three points).
    """
    points = []
    with torch_threads(num_threads or compute_threads()) as threads:
        model = build_model(preset, seed=seed, device="cpu")
        time_decode_step(model, synthetic_kv(model, 64, block_size), 1, 2)  # warm up
        for context in context_tokens:
            kv = synthetic_kv(model, context, block_size)
            for batch_size in batch_sizes:
                step_s = time_decode_step(model, kv, batch_size, num_steps)
                points.append(
                    {
                        "batch_size": batch_size,
                        "context_tokens": context,
                        "step_s": step_s,
                        "tokens_per_s": batch_size / step_s,
                    }
                )
    fit = None
    if len(points) >= 3:  # the fit has three coefficients
        decode_fit = fit_decode(
            (p["batch_size"], p["batch_size"] * p["context_tokens"], p["step_s"]) for p in points
        )
        fit = dataclasses.asdict(decode_fit)
    return {
        "preset": preset,
        "torch_threads": threads,
        "num_steps": num_steps,
        "points": points,
        "fit": fit,
    }
