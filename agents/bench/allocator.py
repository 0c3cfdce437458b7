"""How fast a young agent's prefills settle, with glibc's default allocator and with
`steady_allocator` (agents/node/allocator.py).

Each variant runs in a fresh process, as an agent starts: the model is built, then
prefills of random lengths are served one at a time, each from the next of a pool of
threads (as gRPC hands calls to its pool), and the CPU time of each is taken on its own
thread. The figure is CPU milliseconds per 100 prompt tokens over the first calls against
the last ones; a ratio near 1 means an agent computes at its steady speed from the start.
"""

import json
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np

VARIANTS = ("default", "steady")


def allocator_benchmark(
    preset: str = "tiny", *, num_calls: int = 160, num_threads: int = 16, seed: int = 0
) -> dict[str, Any]:
    """Per variant: ms per 100 tokens over the first 20 calls and the last 40, and their
    ratio; both variants serve the same prompt lengths."""
    result: dict[str, Any] = {"preset": preset, "num_calls": num_calls, "num_threads": num_threads}
    for variant in VARIANTS:
        command = [
            sys.executable, "-m", "agents.bench.allocator",
            variant, preset, str(num_calls), str(num_threads), str(seed),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
        calls = json.loads(done.stdout)
        per_100 = [1e5 * cpu_s / tokens for tokens, cpu_s in calls]
        first = statistics.median(per_100[:20])
        last = statistics.median(per_100[-40:])
        result[f"{variant}_first_ms_per_100"] = round(first, 3)
        result[f"{variant}_steady_ms_per_100"] = round(last, 3)
        result[f"{variant}_first_over_steady"] = round(first / last, 3)
    return result


def _serve(variant: str, preset: str, num_calls: int, num_threads: int, seed: int) -> None:
    """One young process's calls as (tokens, CPU seconds), printed as JSON."""
    if variant == "steady":
        from agents.node.allocator import steady_allocator

        steady_allocator()
    import torch

    from agents.model import build_model
    from agents.workers.prefill import PrefillWorker

    torch.set_num_threads(1)  # as on a shared host (backend/cli/children.py)
    model = build_model(preset, seed=seed)
    worker = PrefillWorker(model, 16)
    rng = np.random.default_rng(seed)
    lengths = [int(n) for n in rng.integers(50, 1500, num_calls)]
    prompts = [rng.integers(0, model.config.vocab_size, n) for n in lengths]
    calls: list[tuple[int, float]] = []
    turns = [threading.Event() for _ in range(num_threads)]
    finished = threading.Event()

    def thread(index: int) -> None:
        for call in range(index, num_calls, num_threads):
            turns[index].wait()
            turns[index].clear()
            started = time.thread_time()
            worker.prefill(prompts[call])
            calls.append((lengths[call], time.thread_time() - started))
            if call + 1 < num_calls:
                turns[(index + 1) % num_threads].set()
            else:
                finished.set()

    threads = [threading.Thread(target=thread, args=(i,), daemon=True) for i in range(num_threads)]
    for started_thread in threads:
        started_thread.start()
    turns[0].set()
    finished.wait()
    print(json.dumps(calls))


if __name__ == "__main__":
    variant, preset, num_calls, num_threads, seed = sys.argv[1:6]
    _serve(variant, preset, int(num_calls), int(num_threads), int(seed))
