"""run_profile: measure one model preset on this machine and build a kvcentric-profile/1 dict.

The dict is what both readers take: backend.policy.CostModel.from_profile fits its prefill
and decode forms from the points, and twin.timing.load_timing interpolates them
(MeasuredTiming); `measured` keeps the machine and the raw per-tier figures.
"""

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from agents.bench.threads import compute_threads, torch_threads
from agents.model import build_model
from agents.profiling.compute import measure_decode, measure_prefill
from agents.profiling.grid import QUICK_GRID, ProfileGrid
from agents.profiling.io_speeds import measure_link, measure_tiers
from agents.profiling.machine import default_capacities, machine_info
from backend.policy.cost_model import PROFILE_FORMAT

# on_progress(steps done, steps in all, what was just measured)
OnProgress = Callable[[int, int, str], None]


def run_profile(
    preset: str,
    *,
    block_size: int = 64,
    grid: ProfileGrid = QUICK_GRID,
    ssd_dir: Path | None = None,
    name: str | None = None,
    dram_capacity_bytes: int | None = None,
    ssd_capacity_bytes: int | None = None,
    decode_kv_capacity_tokens: int | None = None,
    device: str | None = None,
    seed: int = 0,
    on_progress: OnProgress | None = None,
) -> dict[str, Any]:
    """Measure prefill, decode, pool tiers and the link; return the profile dict.

    Raises ValueError for an unknown preset, a block size below one or a decode KV
    capacity too small for three decode shapes.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")
    started_s = time.perf_counter()
    with torch_threads(compute_threads()):
        model = build_model(preset, seed=seed, device=device)
        dtype_bytes = torch.empty((), dtype=model.dtype).element_size()
        kv_bytes_per_token = model.config.kv_bytes_per_token(dtype_bytes)
        capacities = default_capacities(model, kv_bytes_per_token, ssd_dir)
        overrides = {
            "dram_capacity_bytes": dram_capacity_bytes,
            "ssd_capacity_bytes": ssd_capacity_bytes,
            "decode_kv_capacity_tokens": decode_kv_capacity_tokens,
        }
        capacities |= {key: value for key, value in overrides.items() if value is not None}
        prefill_cells = grid.prefill_cells(block_size)
        decode_cells = grid.decode_cells(capacities["decode_kv_capacity_tokens"])
        total = (len(prefill_cells) + len(decode_cells)) * grid.num_rounds + 2
        done = 0

        def step(what: str) -> None:
            nonlocal done
            done += 1
            if on_progress is not None:
                on_progress(done, total, what)

        rounds = grid.num_rounds
        prefill_points = measure_prefill(
            model, prefill_cells, block_size=block_size, num_repeats=rounds, seed=seed,
            on_step=step,
        )  # fmt: skip
        decode_points = measure_decode(
            model, decode_cells, block_size=block_size, num_rounds=rounds,
            num_steps=grid.num_decode_steps, on_step=step,
        )  # fmt: skip
        info = machine_info(model)
    block_bytes = model.config.block_bytes(block_size, dtype_bytes)
    tiers = measure_tiers(block_bytes, num_blocks=grid.num_pool_blocks, ssd_dir=ssd_dir)
    step("pool tiers")
    link = measure_link(num_blocks=grid.link_num_blocks, repeats=grid.link_repeats)
    step("transport link")
    return {
        "format": PROFILE_FORMAT,
        "name": name or f"{preset}-{model.device.type}",
        "kv_bytes_per_token": kv_bytes_per_token,
        "instance": capacities,
        "link": {
            "bandwidth_bytes_per_s": link["bandwidth_bytes_per_s"],
            "latency_s": link["latency_s"],
        },
        "storage": {
            "dram_read_bytes_per_s": tiers["dram_read_bytes_per_s"],
            "ssd_read_bytes_per_s": tiers["ssd_read_bytes_per_s"],
        },
        "prefill_points": prefill_points,
        "decode_points": decode_points,
        "measured": {
            "what": (
                "kvcentric profile: prefill and decode of the real torch workers, pool tiers "
                "via agents.pool.bench, link via our TCP transport between two processes"
            ),
            "preset": preset,
            "block_size": block_size,
            "block_bytes": block_bytes,
            "machine": info,
            "grid": asdict(grid),
            "pool": tiers,
            "link": link,
            "wall_s": time.perf_counter() - started_s,
        },
    }


def write_profile(profile: dict[str, Any], path: Path) -> None:
    """Write `profile` as indented JSON (OSError when the path cannot be written)."""
    path.write_text(json.dumps(profile, indent=2) + "\n")
