"""How steady this host's speed is: the noise floor of a calibration from a short window.

`kvcentric twin validate` calibrates the twin from the warm-up it replays first and predicts
the window after it at the speed the warm-up measured. On a shared virtual machine the
host's speed for the agents' work is not a constant: what the caches and the memory bus
give one thread moves with the neighbours' load, unseen by the guest. However right the
model, a prediction is then no closer than the host's speed in the warm-up is to its speed
in the window.

This benchmark measures that on one thread, with nothing else of ours running: three probes
are called in turn for `duration_s`, and the CPU time of each call is taken on the thread:

- `decode`: one decode step of the agents' model, a batch of 8 requests over 1,000 KV
  tokens each (requests replaced as they finish, so the batch's shape holds);
- `compute`: a 256x256 matrix product, held in the core's caches;
- `memory`: a 32 MiB copy, larger than the caches.

Per probe it reports the mean CPU time per call in consecutive windows of `window_s`
against the run's mean, and how well each window predicts the two after it (a warm-up
minute against the two-minute window the acceptance of twin fidelity replays, both at the
same speed): the relative error of the window's mean against the next two windows' mean.
"""

import time
from collections.abc import Callable
from typing import Any

import numpy as np

PROBES = ("decode", "compute", "memory")
DECODE_BATCH = 8
DECODE_CONTEXT_TOKENS = 1000
DECODE_MAX_TOKENS = 40
MATRIX_SIZE = 256
COPY_BYTES = 32 * 1024 * 1024
WINDOWS_PREDICTED = 2  # a window predicts the next two (warm-up minute 0-1, window 1-3)


def host_drift_benchmark(
    preset: str = "tiny",
    *,
    duration_s: float = 90.0,
    window_s: float = 7.5,
    on_progress: Callable[[float], None] | None = None,
) -> dict[str, Any]:
    """Per probe: each window's mean CPU seconds per call over the run's mean (`windows`),
    their max over min (`spread`), and each window's error predicting the next two
    (`median_abs_err`, `max_abs_err`, `share_over_10pct`)."""
    num_windows = count_windows(duration_s, window_s)
    calls = _call_probes(preset, num_windows * window_s, on_progress)
    result: dict[str, Any] = {
        "preset": preset,
        "duration_s": num_windows * window_s,
        "window_s": window_s,
        "num_windows": num_windows,
    }
    for probe in PROBES:
        times = np.array([(t, cpu_s) for name, t, cpu_s in calls if name == probe])
        index = np.minimum((times[:, 0] // window_s).astype(int), num_windows - 1)
        sums = np.bincount(index, weights=times[:, 1], minlength=num_windows)
        counts = np.bincount(index, minlength=num_windows)
        means = sums / np.maximum(counts, 1)
        errors = [
            means[k] / (sums[k + 1 : k + 1 + WINDOWS_PREDICTED].sum()
                        / counts[k + 1 : k + 1 + WINDOWS_PREDICTED].sum()) - 1
            for k in range(num_windows - WINDOWS_PREDICTED)
        ]  # fmt: skip
        abs_errors = np.abs(errors)
        result[probe] = {
            "calls": int(counts.sum()),
            "mean_ms": round(1e3 * float(times[:, 1].mean()), 4),
            "windows": [round(float(m / times[:, 1].mean()), 4) for m in means],
            "spread": round(float(means.max() / means.min()), 4),
            "median_abs_err": round(float(np.median(abs_errors)), 4),
            "max_abs_err": round(float(abs_errors.max()), 4),
            "share_over_10pct": round(float((abs_errors > 0.10).mean()), 4),
        }
    return result


def count_windows(duration_s: float, window_s: float) -> int:
    """Whole windows in the run; ValueError when they are too few for one prediction."""
    num_windows = int(duration_s // window_s)
    if num_windows < WINDOWS_PREDICTED + 1:
        raise ValueError(
            f"a run of {duration_s:g} s holds {num_windows} windows of {window_s:g} s; "
            f"at least {WINDOWS_PREDICTED + 1} are needed for one prediction"
        )
    return num_windows


def _call_probes(
    preset: str, duration_s: float, on_progress: Callable[[float], None] | None
) -> list[tuple[str, float, float]]:
    """(probe, seconds since the start, CPU seconds) of every call, probes taken in turn."""
    from agents.node.allocator import steady_allocator

    steady_allocator()  # as an agent's process sets it (agents/node/allocator.py)
    import torch

    from agents.model import build_model
    from agents.profiling.compute import synthetic_kv
    from agents.workers.decode import DecodeRequest, DecodeWorker

    torch.set_num_threads(1)  # as each agent of a shared host (backend/cli/children.py)
    model = build_model(preset)
    kv = synthetic_kv(model, DECODE_CONTEXT_TOKENS, 64)
    worker = DecodeWorker(model, max_batch_size=DECODE_BATCH)
    a, b = torch.randn(MATRIX_SIZE, MATRIX_SIZE), torch.randn(MATRIX_SIZE, MATRIX_SIZE)
    source = torch.empty(COPY_BYTES // 4)
    target = torch.empty_like(source)
    submitted = 0

    def decode() -> None:
        nonlocal submitted
        while worker.batch_size < DECODE_BATCH:
            worker.submit(DecodeRequest(f"r{submitted}", kv, 1, DECODE_MAX_TOKENS))
            submitted += 1
        worker.step()

    probes: dict[str, Callable[[], Any]] = {
        "decode": decode,
        "compute": lambda: torch.mm(a, b),
        "memory": lambda: target.copy_(source),
    }
    for probe in probes.values():  # first calls allocate; not measured
        probe()
    calls: list[tuple[str, float, float]] = []
    started_s = time.perf_counter()
    reported_s = 0.0
    while (elapsed_s := time.perf_counter() - started_s) < duration_s:
        for name, probe in probes.items():
            cpu_s = time.thread_time()
            probe()
            calls.append((name, elapsed_s, time.thread_time() - cpu_s))
        if on_progress is not None and elapsed_s - reported_s >= 0.5:
            on_progress(elapsed_s)
            reported_s = elapsed_s
    return calls
