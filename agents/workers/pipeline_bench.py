"""The CPP benchmark: one long prefill on a single agent vs through a pipeline group."""

import time
from typing import Any

import numpy as np
import torch

from agents.model.registry import resolve_model
from agents.workers.pipeline import PipelineGroup


def pipeline_benchmark(
    preset: str = "tiny",
    context_tokens: int = 4096,
    num_stages: int = 2,
    *,
    prefill_chunk_tokens: int = 512,
    block_size: int = 64,
    num_repeats: int = 3,
    seed: int = 0,
) -> dict[str, Any]:
    """One `context_tokens` prefill on one agent (all layers, one process) vs the pipeline.

    Both run in the same group's stage processes with one torch thread each, so the
    pipeline's gain is its overlap across stages, less the chunking and hand-off costs.
    Returns single_agent_s and pipelined_s (medians of repeats after a warm-up) and speedup.
    """
    if context_tokens <= prefill_chunk_tokens:
        raise ValueError("context_tokens must exceed prefill_chunk_tokens to be pipelined")
    tokens = torch.from_numpy(
        np.random.default_rng(seed).integers(
            0, resolve_model(preset).model_config().vocab_size, context_tokens
        )
    )
    times: dict[bool, list[float]] = {False: [], True: []}
    with PipelineGroup(
        preset, num_stages, seed=seed, block_size=block_size,
        prefill_chunk_tokens=prefill_chunk_tokens, device="cpu",
    ) as group:  # fmt: skip
        for pipelined in (False, True):
            group._prefill(tokens, pipelined=pipelined)  # warm-up
        for _ in range(num_repeats):
            for pipelined in (False, True):
                started_s = time.perf_counter()
                group._prefill(tokens, pipelined=pipelined)
                times[pipelined].append(time.perf_counter() - started_s)
    single_s, pipelined_s = float(np.median(times[False])), float(np.median(times[True]))
    return {
        "preset": preset,
        "context_tokens": context_tokens,
        "num_stages": num_stages,
        "prefill_chunk_tokens": prefill_chunk_tokens,
        "single_agent_s": single_s,
        "pipelined_s": pipelined_s,
        "speedup": single_s / pipelined_s,
    }
