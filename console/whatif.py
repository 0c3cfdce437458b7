"""The what-if runs behind the console: the twin's config of the live cluster (P:D from its
agents, policy settings from its configuration, the console's timing profile), a proposed
change applied to it, trace rows from a recorded window or an upload, and `twin.compare`
run on both with progress reported in the caller's thread.

The twin runs at the block size its trace's hash ids stand for: a recorded window is
exported (GET /v1/export/trace) at the Conductor's own block size, so every block the live
cluster could cache keeps its id; an uploaded public trace has TRACE_BLOCK_SIZE blocks.
"""

import math
import os
import queue
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.traces.loader import TRACE_BLOCK_SIZE, TraceError, TraceRow, iter_trace
from twin.cluster import LiveCalibration
from twin.compare import compare
from twin.config import TwinConfig

PROGRESS_POLL_S = 0.25
# The series of a what-if run get about this many windows.
NUM_SERIES_WINDOWS = 60
ROLES = ("prefill", "decode")
LIVE_PROFILE_PREFIX = "live-profile-"  # the file a what-if writes the live profile to

OnProgress = Callable[[float, str], None]


@dataclass(frozen=True, slots=True)
class ProposedChange:
    """What the operator wants to try; None keeps the live value."""

    threshold: float | None = None
    scheduler: str | None = None
    rejection: str | None = None
    decode_time_s: float | None = None
    num_prefill: int | None = None


class TraceProblem(ValueError):
    """A trace the twin cannot replay; str() names the source and, when known, the line."""

    def __init__(self, message: str, line_number: int | None = None) -> None:
        super().__init__(message)
        self.line_number = line_number


def live_split(agents: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """(prefill, decode) agents serving now; draining ones are on their way out."""
    active = [agent for agent in agents if agent.get("state", "active") == "active"]
    return tuple(sum(agent["role"] == role for agent in active) for role in ROLES)  # type: ignore[return-value]


def live_twin_config(
    policy: Mapping[str, Any], agents: Sequence[Mapping[str, Any]], *, profile: str
) -> TwinConfig:
    """The twin's model of the live cluster: its split, its policy settings and SLOs."""
    num_prefill, num_decode = live_split(agents)
    if num_prefill < 1 or num_decode < 1:
        raise ValueError(
            f"the live cluster has {num_prefill} prefill and {num_decode} decode agents "
            "serving; the twin needs at least one of each"
        )
    return TwinConfig.of_live_policy(
        policy, num_prefill=num_prefill, num_decode=num_decode, profile=profile
    )


def live_profile_file(profile: Mapping[str, Any]) -> str:
    """The live profile as a file the twin reads (one per content, reused across reruns)."""
    import hashlib
    import json

    text = json.dumps(profile, sort_keys=True)
    folder = Path(tempfile.gettempdir()) / "kvcentric-console"
    folder.mkdir(exist_ok=True)
    path = folder / f"{LIVE_PROFILE_PREFIX}{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
    if not path.exists():
        path.write_text(text)
    return str(path)


def live_beliefs(
    calibration: Mapping[str, Any],
    rows: Sequence[TraceRow],
    *,
    window_start_s: float,
    speed: float = 1.0,
) -> LiveCalibration | None:
    """What the live Conductor believed over a recorded window, for the twin's run of it:
    the twin's Conductor believes each model live's believed from when it did (so it admits,
    routes and refuses by the same estimates), and after the window's last arrival takes
    over live's calibration and refits on its own. None where the Conductor does not
    calibrate or kept nothing (`calibration` is GET /v1/calibration with inputs).

    `window_start_s`: the export's start (Unix seconds), from which its rows are timed; the
    twin's clock starts at the first row."""
    inputs = calibration.get("profile_inputs")
    if not calibration.get("enabled") or inputs is None or not rows:
        return None
    first_ms, last_ms = rows[0].timestamp_ms, rows[-1].timestamp_ms
    last_refit_s = calibration.get("last_refit_s")
    return LiveCalibration.of_inputs(
        inputs,
        zero_s=window_start_s + first_ms / 1000.0,
        last_refit_s=None if last_refit_s is None else float(last_refit_s),
        from_s=(last_ms - first_ms) / 1000.0 / speed,
    )


def proposed_config(current: TwinConfig, change: ProposedChange) -> TwinConfig:
    """`current` with the change; the P:D split keeps the cluster's total."""
    total = current.num_prefill + current.num_decode
    num_prefill = current.num_prefill if change.num_prefill is None else change.num_prefill
    if not 1 <= num_prefill < total:
        raise ValueError(f"{num_prefill} prefill agents of {total} leaves no decode agent")
    updates: dict[str, Any] = {"num_prefill": num_prefill, "num_decode": total - num_prefill}
    for name in ("threshold", "scheduler", "rejection", "decode_time_s"):
        value = getattr(change, name)
        if value is not None:
            updates[name] = value
    return current.with_changes(**updates)


def policy_changes(current: TwinConfig, candidate: TwinConfig) -> dict[str, Any]:
    """The live configuration's settings (PolicyConfig names) the candidate changes."""
    names = {
        "threshold": "kvcache_balancing_threshold",
        "scheduler": "prefill_scheduler",
        "rejection": "rejection_policy",
        "decode_time_s": "decode_time_s",
    }
    return {
        policy_name: getattr(candidate, twin_name)
        for twin_name, policy_name in names.items()
        if getattr(candidate, twin_name) != getattr(current, twin_name)
    }


def role_switches(agents: Sequence[Mapping[str, Any]], num_prefill: int) -> list[tuple[str, str]]:
    """(instance id, new role) moves that reach `num_prefill` prefill agents, taking the
    least busy agents of the pool that gives them up."""
    current_prefill, _ = live_split(agents)
    moves = num_prefill - current_prefill
    if moves == 0:
        return []
    donor, target = ("decode", "prefill") if moves > 0 else ("prefill", "decode")
    donors = [a for a in agents if a["role"] == donor and a.get("state", "active") == "active"]
    donors.sort(key=lambda a: (_busy(a["load"]), a["instance_id"]))
    return [(agent["instance_id"], target) for agent in donors[: abs(moves)]]


def rows_from_jsonl(
    data: bytes, source: str, *, block_size: int = TRACE_BLOCK_SIZE
) -> list[TraceRow]:
    """The rows of a Mooncake JSONL trace held in memory, one hash id per `block_size`
    tokens; TraceProblem names `source` and the line of the first malformed row."""
    with tempfile.TemporaryDirectory(prefix="kvc-console-") as folder:
        path = Path(folder) / "trace.jsonl"
        path.write_bytes(data)
        try:
            return list(iter_trace(path, block_size))
        except TraceError as error:
            raise TraceProblem(
                f"{source}, line {error.line_number}: {error.problem}", error.line_number
            ) from None


def series_interval_s(rows: Sequence[TraceRow], speed: float = 1.0) -> float:
    """A series window giving about NUM_SERIES_WINDOWS windows over the rows' span."""
    if len(rows) < 2:
        return 1.0
    span_s = (rows[-1].timestamp_ms - rows[0].timestamp_ms) / 1000.0 / speed
    return max(1.0, math.ceil(span_s / NUM_SERIES_WINDOWS))


def run_whatif(
    current: TwinConfig,
    candidate: TwinConfig,
    rows: Sequence[TraceRow],
    *,
    on_progress: OnProgress | None = None,
    trace_label: str = "",
    workers: int | None = None,
    ray_address: str | None = None,
    beliefs: LiveCalibration | None = None,
) -> dict[str, Any]:
    """`twin.compare` of both configs on the same rows (the what-if result).

    `beliefs`: what live's Conductor believed over the rows (`live_beliefs`), believed by
    the run of the current configuration and by a candidate on the same split (a policy
    setting changes what the cluster is asked to do, not how fast it computes); a
    candidate on another split calibrates on its own replay (live's beliefs were of the
    current split's crowding).

    The comparison runs in a helper thread (its simulations in worker processes) while this
    thread calls `on_progress(fraction, text)` a few times a second, so a Streamlit page can
    move its progress bar: Streamlit elements may only be touched from the script's thread.
    """
    interval_s = series_interval_s(rows, current.speed)
    configs = [config.with_changes(series_interval_s=interval_s) for config in (current, candidate)]
    num_workers = workers or max(1, min(len(configs), os.cpu_count() or 1))
    same_split = (current.num_prefill, current.num_decode) == (
        candidate.num_prefill,
        candidate.num_decode,
    )
    finished: queue.Queue[int] = queue.Queue()
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["result"] = compare(
                *configs,
                rows,
                workers=num_workers,
                trace_label=trace_label,
                on_done=lambda index, report: finished.put(index),
                ray_address=ray_address,
                live_calibrations=(beliefs, beliefs if same_split else None),
            )
        except BaseException as error:  # re-raised in the caller's thread
            outcome["error"] = error

    started_s = time.monotonic()
    thread = threading.Thread(target=work, name="whatif", daemon=True)
    thread.start()
    num_done = 0
    while thread.is_alive():
        thread.join(PROGRESS_POLL_S)
        while not finished.empty():
            finished.get()
            num_done += 1
        if on_progress is not None:
            elapsed_s = time.monotonic() - started_s
            on_progress(
                num_done / len(configs),
                f"simulating {len(rows):,} requests twice (current, proposed): "
                f"{num_done} of {len(configs)} runs done, {elapsed_s:.0f} s",
            )
    if "error" in outcome:
        raise outcome["error"]
    if on_progress is not None:
        on_progress(1.0, f"done in {time.monotonic() - started_s:.1f} s")
    return outcome["result"]


def _busy(load: Mapping[str, Any]) -> float:
    return float(load.get("num_queued", 0) + load.get("num_running", 0) + load.get("batch_size", 0))
