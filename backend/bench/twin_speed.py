"""The twin speed benchmark: a whole trace through the digital twin, against the policy alone.

The baseline is the policy replay benchmark on the same trace and cluster (the core with a
minimal event loop and no SimPy): the ratio says what the simulated cluster costs on top
of the decisions themselves.
"""

import time
from dataclasses import dataclass
from pathlib import Path

from backend.bench.policy_replay import replay_trace
from backend.traces.loader import load_trace
from twin.config import TwinConfig
from twin.run import simulate


@dataclass(frozen=True, slots=True)
class TwinSpeed:
    num_requests: int
    num_prefill: int
    num_decode: int
    profile: str
    simulated_s: float
    sim_wall_s: float
    faster_than_real_time: float
    baseline_policy_replay_wall_s: float
    ratio_to_policy_replay: float
    num_completed: int
    num_rejected: int


def measure_twin_speed(trace: Path, *, num_prefill: int, num_decode: int) -> TwinSpeed:
    """Time `simulate` on the whole trace, then the policy-only replay as the baseline."""
    rows = load_trace(trace)
    config = TwinConfig(num_prefill=num_prefill, num_decode=num_decode)
    started_s = time.perf_counter()
    report = simulate(config, rows)
    sim_wall_s = time.perf_counter() - started_s
    started_s = time.perf_counter()
    replay_trace(rows, num_prefill_instances=num_prefill, num_decode_instances=num_decode)
    baseline_s = time.perf_counter() - started_s
    return TwinSpeed(
        num_requests=report["num_requests"],
        num_prefill=num_prefill,
        num_decode=num_decode,
        profile=config.profile,
        simulated_s=report["sim_duration_s"],
        sim_wall_s=sim_wall_s,
        faster_than_real_time=report["sim_duration_s"] / sim_wall_s,
        baseline_policy_replay_wall_s=baseline_s,
        ratio_to_policy_replay=sim_wall_s / baseline_s,
        num_completed=report["num_completed"],
        num_rejected=report["num_rejected"],
    )
