"""Our workers against transformers on the same real model: prefill and decode step times.

Both run the same dequantized GGUF weights in fp32 on this machine's CPU, in one process,
with the same torch threads, on the same inputs:

- prefill of N new tokens: our `PrefillWorker.prefill` (layer-wise, storing the new blocks)
  against transformers' forward that builds its KV cache and keeps the last position's
  logits only (`logits_to_keep=1`), as ours does;
- a decode step of a batch of B requests with C context tokens each: our `DecodeWorker.step`
  against transformers' forward of one new token per request over a batched KV cache of C
  tokens (its `DynamicCache`, filled by a batched prefill first).

`ratio` is transformers' time over ours: above 1 ours is faster. Each point is measured in
`num_repeats` rounds that alternate ours and theirs, and each side keeps its fastest round:
on a small shared machine the slowest rounds measure the neighbours, and alternating puts
both sides through the same moments. Memory: the resident set of this process before and
after loading our model (what an agent's model costs).

transformers is a test dependency (`pip install -e '.[dev]'`); the benchmark says so when
it is missing.
"""

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.bench.threads import compute_threads, torch_threads
from agents.model import build_model
from agents.model.registry import resolve_model
from agents.profiling.compute import time_decode_step
from agents.workers.prefill import PrefillWorker


def _rss_bytes() -> int:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    import resource

    return pages * resource.getpagesize()


def _seconds(run) -> float:
    started_s = time.perf_counter()
    run()
    return time.perf_counter() - started_s


def _fastest_rounds(ours, theirs, repeats: int) -> tuple[float, float]:
    """Each callable's fastest time (seconds) over `repeats` rounds, one of each per round,
    alternating, after one warm-up of each."""
    ours(), theirs()
    best_ours = best_theirs = float("inf")
    for _ in range(repeats):
        best_ours = min(best_ours, ours())
        best_theirs = min(best_theirs, theirs())
    return best_ours, best_theirs


def _reference(checkpoint: Path):
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise ValueError(
            "the reference needs transformers: pip install transformers accelerate "
            "(or pip install -e '.[dev]')"
        ) from None
    if checkpoint.suffix == ".gguf":
        loaded = AutoModelForCausalLM.from_pretrained(
            str(checkpoint.parent), gguf_file=checkpoint.name, dtype=torch.float32
        )
    else:
        loaded = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32)
    return loaded.eval()


@torch.no_grad()
def against_transformers_benchmark(
    model: str = "smollm2-135m",
    *,
    prefill_tokens: tuple[int, ...] = (512, 2048, 4096),
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32),
    context_tokens: int = 256,
    block_size: int = 64,
    num_repeats: int = 3,
    num_steps: int = 5,
    num_threads: int | None = None,
) -> dict[str, Any]:
    source = resolve_model(model)
    if source.checkpoint is None:
        raise ValueError(f"{model!r} is a dummy preset: transformers has no weights for it")
    with torch_threads(num_threads or compute_threads()) as threads:
        rss_before = _rss_bytes()
        ours = build_model(model, device="cpu")
        rss_model = _rss_bytes() - rss_before
        theirs = _reference(source.checkpoint)
        vocab = ours.config.vocab_size
        rng = np.random.default_rng(0)
        worker = PrefillWorker(ours, block_size)
        prefill = []
        for num_tokens in prefill_tokens:
            tokens = rng.integers(0, vocab, num_tokens)
            ids = torch.from_numpy(tokens)[None]
            ours_s, theirs_s = _fastest_rounds(
                lambda t=tokens: _seconds(lambda: worker.prefill(t)),
                lambda i=ids: _seconds(lambda: theirs(i, use_cache=True, logits_to_keep=1)),
                num_repeats,
            )
            prefill.append(
                {
                    "tokens": num_tokens,
                    "ours_s": ours_s,
                    "transformers_s": theirs_s,
                    "ours_tokens_per_s": num_tokens / ours_s,
                    "transformers_tokens_per_s": num_tokens / theirs_s,
                    "ratio": theirs_s / ours_s,
                }
            )
        decode = []
        prompt = rng.integers(0, vocab, context_tokens)
        kv = worker.prefill(prompt).paged_kv(block_size)
        for batch_size in batch_sizes:
            ours_s, theirs_s = _fastest_rounds(
                lambda b=batch_size: time_decode_step(ours, kv, b, num_steps),
                lambda b=batch_size: _their_step_s(theirs, prompt, b, num_steps),
                num_repeats,
            )
            decode.append(
                {
                    "batch_size": batch_size,
                    "context_tokens": context_tokens,
                    "ours_s": ours_s,
                    "transformers_s": theirs_s,
                    "ratio": theirs_s / ours_s,
                }
            )
    return {
        "model": model,
        "checkpoint": str(source.checkpoint),
        "torch_threads": threads,
        "num_repeats": num_repeats,
        "model_rss_bytes": rss_model,
        "model_param_bytes": sum(p.numel() * p.element_size() for p in ours.parameters()),
        "prefill": prefill,
        "decode": decode,
        "min_ratio": min(point["ratio"] for point in prefill + decode),
    }


def _their_step_s(reference, prompt: np.ndarray, batch_size: int, num_steps: int) -> float:
    ids = torch.from_numpy(prompt)[None].repeat(batch_size, 1)
    out = reference(ids, use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    step_ids = torch.ones((batch_size, 1), dtype=torch.int64)
    times = []
    for _ in range(num_steps + 1):
        started_s = time.perf_counter()
        out = reference(step_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        times.append(time.perf_counter() - started_s)
        cache = out.past_key_values
    return statistics.median(times[1:])
