"""simulate(): one twin run of a trace on a TwinConfig, returning its report dict."""

import math
import time
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from backend.policy.cost_model import CostModel
from backend.policy.decode_load import forecast_error
from backend.traces.arrivals import arrivals_from_rows
from backend.traces.loader import TraceRow
from twin.cluster import LiveCalibration, TwinCluster
from twin.config import TwinConfig
from twin.report import build_report
from twin.slo import derive_slos
from twin.timing import believed_from_profile, load_timing


@lru_cache(maxsize=8)
def believed_cost_model(profile: str, block_size: int) -> CostModel:
    """The cost model the policy runs with (twin.timing.believed_from_profile)."""
    return believed_from_profile(profile, block_size)


def simulate(
    config: TwinConfig,
    rows: Sequence[TraceRow],
    *,
    trace_label: str = "",
    on_progress: Callable[[float], None] | None = None,
    measure_from_s: float = 0.0,
    live_calibration: LiveCalibration | None = None,
) -> dict[str, Any]:
    """Run `rows` through a simulated cluster driven by the real policy core.

    `measure_from_s`: the rows arriving earlier (seconds from the first row) only warm the
    cluster up (caches, queues, batches, as a live window has them); the report covers
    the requests arriving from then on, and the decode steps and loads from then on.
    `live_calibration`: the live Conductor's calibration as that window began, which the
    twin's online calibration takes over then (`LiveCalibration`)."""
    started_s = time.perf_counter()
    timing = load_timing(config.profile, noise=config.noise, seed=config.seed)
    cost = believed_cost_model(config.profile, config.block_size)
    if config.ttft_slo_s is None or config.tbt_slo_s is None:
        ttft_slo_s, tbt_slo_s = derive_slos(load_timing(config.profile), rows)
        config = config.with_changes(
            ttft_slo_s=config.ttft_slo_s or ttft_slo_s, tbt_slo_s=config.tbt_slo_s or tbt_slo_s
        )
    block_bytes = config.block_size * timing.kv_bytes_per_token
    capacities = timing.instance
    dram_blocks = _pick(config.dram_capacity_blocks, capacities.dram_capacity_bytes // block_bytes)
    ssd_blocks = _pick(config.ssd_capacity_blocks, capacities.ssd_capacity_bytes // block_bytes)
    decode_tokens = _pick(config.decode_kv_capacity_tokens, capacities.decode_kv_capacity_tokens)
    cluster = TwinCluster(
        config,
        timing,
        cost,
        dram_blocks=dram_blocks,
        ssd_blocks=ssd_blocks,
        decode_kv_capacity_tokens=decode_tokens,
        live_calibration=live_calibration,
    )
    arrivals = arrivals_from_rows(rows, block_size=config.block_size, speed=config.speed)
    cluster.run(arrivals, on_progress)
    _check_conservation(cluster, len(arrivals), dram_blocks, ssd_blocks)
    if on_progress is not None:
        on_progress(1.0)
    decode = list(cluster.decode.values())
    shards = [instance.shard for instance in cluster.prefill.values()]
    recorder = cluster.recorder
    records = [r for r in recorder.records.values() if r.arrival_s >= measure_from_s]
    loads = [
        (t, p, d)
        for t, p, d in zip(
            recorder.load_samples_t_s,
            recorder.prefill_load_samples,
            recorder.decode_load_samples,
            strict=True,
        )
        if t >= measure_from_s
    ]
    epoch_t_s = np.concatenate([np.asarray(d.epoch_t_s) for d in decode])
    measured = epoch_t_s >= measure_from_s
    return build_report(
        config,
        records,
        load_t_s=[t for t, _, _ in loads],
        prefill_load=[p for _, p, _ in loads],
        decode_load=[d for _, _, d in loads],
        tbt_steps_s=np.concatenate([np.asarray(d.epoch_step_s) for d in decode])[measured],
        tbt_tokens=np.concatenate([np.asarray(d.epoch_tokens) for d in decode])[measured],
        num_replicated_blocks=sum(r.replicated_blocks for r in records),
        sim_duration_s=cluster.env.now,
        sim_wall_s=time.perf_counter() - started_s,
        trace={
            "label": trace_label,
            "num_rows": len(rows),
            "first_line": rows[0].line_number if rows else None,
            "last_line": rows[-1].line_number if rows else None,
        },
        extra={
            "pool": {
                "dram_capacity_blocks": dram_blocks,
                "ssd_capacity_blocks": ssd_blocks,
                "max_dram_blocks": max(shard.max_dram_blocks for shard in shards),
                "max_ssd_blocks": max(shard.max_ssd_blocks for shard in shards),
                "decode_kv_capacity_tokens": decode_tokens,
            },
            # How right early-predicted's forecast of the decode pool was (none otherwise).
            **forecast_error(cluster.core.forecasts.between(measure_from_s, math.inf)),
            "policy_cost_model": cost.to_profile(),
            # With `calibrate`, what the twin's Conductor came to believe, and in how many
            # refits (the same online calibration as live).
            "policy_cost_model_end": cluster.core.cost.to_profile(),
            "num_refits": cluster.calibrator.num_refits if cluster.calibrator else 0,
            # The KV link bandwidth of each pair as the policy came to believe it from the
            # twin's fetches (backend.policy.links), as live does from the agents'.
            "links": cluster.core.links.snapshot(),
            "timing": timing.name,
        },
    )


def _pick(setting: int | None, default: int) -> int:
    return int(default) if setting is None else setting


def _check_conservation(
    cluster: TwinCluster, num_requests: int, dram_blocks: int, ssd_blocks: int
) -> None:
    """The invariants every run must keep; breaking one is a bug in the twin or the policy."""
    recorder = cluster.recorder
    if recorder.num_terminal != num_requests:
        raise RuntimeError(f"{num_requests - recorder.num_terminal} requests never ended")
    if cluster.core.num_in_flight:
        raise RuntimeError(f"the core still tracks {cluster.core.num_in_flight} requests")
    for instance in cluster.prefill.values():
        shard = instance.shard
        if shard.max_dram_blocks > dram_blocks or shard.max_ssd_blocks > ssd_blocks:
            raise RuntimeError(f"{instance.instance_id}'s pool went over its capacity")
