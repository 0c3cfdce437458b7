"""The layer-wise prefill benchmark: stores overlapped with compute vs compute-then-store.

Three prefills of the same prompt: with stores discarded (`compute_s`), with every store
run after the last layer (`serialized_s`), and layer-wise, each layer's store started on a
store thread as soon as the layer is done (`layerwise_s`). A store is real work: copying
the layer's K and V into preallocated host blocks and writing each block's layer bytes to
a temporary file at its serialised offset, optionally slowed to a simulated tier or link
bandwidth (`store_bytes_per_s`, sleeping, so it costs no CPU). Torch gets all cores but
one, which the store thread uses, as a GPU leaves its DMA engines to stores.
"""

import statistics
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from agents.bench.threads import compute_threads, torch_threads
from agents.model import build_model
from agents.workers.kv_io import BlockSink
from agents.workers.prefill import PrefillWorker


class _DiscardSink:
    """Takes stores and drops them: the compute-only baseline."""

    def start_store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> Future[None]:
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def wait_all(self) -> list[torch.Tensor]:
        return []


class _SerializedSink(BlockSink):
    """Holds every layer's store until wait_all, then runs them all: compute, then store."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._held: list[tuple[int, torch.Tensor, torch.Tensor]] = []

    def start_store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> Future[None]:
        self._held.append((layer, k, v))
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def wait_all(self) -> list[torch.Tensor]:
        for layer, k, v in self._held:
            super().start_store(layer, k, v)
        return super().wait_all()


def layerwise_benchmark(
    preset: str = "tiny",
    context_tokens: int = 8192,
    *,
    block_size: int = 512,
    store_bytes_per_s: float | None = None,
    num_repeats: int = 3,
    seed: int = 0,
) -> dict[str, Any]:
    """Layer-wise vs serialized KV stores of one `context_tokens` prefill (medians of repeats).

    Returns compute_s, serialized_s and layerwise_s (whole prefills), store_s (the
    serialized run's store phase, measured on its own), exposed_store_s (how long the
    layer-wise run still waited for stores after its last layer) and hidden_share =
    1 - exposed_store_s / store_s: the share of the store time the layer-wise schedule
    hides, at most about (num_layers - 1) / num_layers since the last layer's store has
    nothing left to overlap. end_to_end_hidden_share = 1 - (layerwise_s - compute_s) /
    store_s also charges the store thread's interference with compute, but carries the
    run-to-run noise of two whole prefills, which dwarfs store_s when stores are cheap.
    """
    if context_tokens < block_size:
        raise ValueError("context_tokens must hold at least one block")
    delay_s_per_byte = 1.0 / store_bytes_per_s if store_bytes_per_s else 0.0
    names = ("compute", "serialized", "layerwise", "store", "exposed")
    runs: dict[str, list[float]] = {name: [] for name in names}
    with torch_threads(compute_threads(spare_cores=1)) as num_threads:
        model = build_model(preset, seed=seed, device="cpu")
        num_layers = model.config.num_layers
        worker = PrefillWorker(model, block_size)
        tokens = np.random.default_rng(seed).integers(0, model.config.vocab_size, context_tokens)
        worker.prefill(tokens[: min(context_tokens, 2 * block_size)])  # warm up
        with ThreadPoolExecutor(1) as store_thread, tempfile.TemporaryFile() as spill:
            store = {"delay_s_per_byte": delay_s_per_byte, "spill_fd": spill.fileno()}
            for _ in range(num_repeats):
                # Interleaved, so drifts in machine load hit all three alike.
                runs["compute"].append(worker.prefill(tokens, sink=_DiscardSink()).timings.total_s)
                serialized = worker.prefill(
                    tokens, sink=_SerializedSink(num_layers, block_size, **store)
                ).timings
                runs["serialized"].append(serialized.total_s)
                runs["store"].append(serialized.store_wait_s)
                sink = BlockSink(num_layers, block_size, executor=store_thread, **store)
                layerwise = worker.prefill(tokens, sink=sink).timings
                runs["layerwise"].append(layerwise.total_s)
                runs["exposed"].append(layerwise.store_wait_s)
    median = {name: statistics.median(values) for name, values in runs.items()}
    store_s = median["store"]
    return {
        "preset": preset,
        "context_tokens": context_tokens,
        "block_size": block_size,
        "kv_bytes": context_tokens
        // block_size
        * model.config.block_bytes(block_size, model.kv_dtype_bytes),
        "store_bytes_per_s": store_bytes_per_s,
        "torch_threads": num_threads,
        "num_repeats": num_repeats,
        "compute_s": median["compute"],
        "serialized_s": median["serialized"],
        "layerwise_s": median["layerwise"],
        "store_s": store_s,
        "exposed_store_s": median["exposed"],
        "hidden_share": 1.0 - median["exposed"] / store_s if store_s > 0 else None,
        "end_to_end_hidden_share": (
            1.0 - (median["layerwise"] - median["compute"]) / store_s if store_s > 0 else None
        ),
    }
