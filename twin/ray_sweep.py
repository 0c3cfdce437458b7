"""Twin runs as Ray tasks: one sweep spread over a Ray cluster (`kvcentric twin sweep --ray`).

The trace is put into Ray's object store once and every task reads it from there; each task
is one `simulate` call, so a run gives the same report as in a local process. Ray is an
optional dependency (`pip install 'kvcentric[ray]'`); on a real cluster every worker needs
kvcentric installed (the same version), as the tasks import `twin` there.

Addresses, as `ray.init` takes them: `auto` (the cluster this machine belongs to, or
RAY_ADDRESS), `HOST:PORT` of a head node, `ray://HOST:10001` (Ray Client from outside the
cluster), or `local`: a Ray instance started here for this sweep and stopped after it, with
`workers` CPUs.
"""

import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any

from backend.traces.loader import TraceRow
from twin.cluster import LiveCalibration
from twin.config import TwinConfig
from twin.sweep import per_config, simulate_one

LOCAL = "local"
CONNECT_TIMEOUT_S = 5.0
OnDone = Callable[[int, dict], None]


def run_on_ray(
    configs: Sequence[TwinConfig],
    rows: Sequence[TraceRow],
    *,
    address: str,
    workers: int,
    trace_label: str = "",
    on_done: OnDone | None = None,
    live_calibrations: Sequence[LiveCalibration | None] | None = None,
) -> list[dict]:
    """Simulate every config as a Ray task; reports in `configs` order, `on_done(index,
    report)` as each ends. The first failing run cancels the rest and its error is raised.
    `live_calibrations`: as `run_sweep`'s."""
    calibrations = per_config(live_calibrations, configs)
    ray = _import_ray()
    started_here = not ray.is_initialized()
    if started_here and address not in (LOCAL, "auto"):
        _check_reachable(address)
    if started_here:
        options: dict[str, Any] = {
            "include_dashboard": False,
            "logging_level": logging.WARNING,
            "log_to_driver": False,
        }
        try:
            if address == LOCAL:
                ray.init(num_cpus=max(1, workers), **options)
            else:
                ray.init(address=address, **options)
        except (ConnectionError, ValueError, RuntimeError) as error:
            raise RuntimeError(f"--ray {address}: cannot start or reach Ray: {error}") from None
    remote = ray.remote(num_cpus=1, max_retries=0)(simulate_one)
    pending: dict[Any, int] = {}
    try:
        trace = ray.put(list(rows))  # once: every task reads it from the object store
        pending = {
            remote.remote(config, trace, trace_label, calibrations[index]): index
            for index, config in enumerate(configs)
        }
        reports: dict[int, dict] = {}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                index = pending.pop(ref)
                reports[index] = ray.get(ref)
                if on_done is not None:
                    on_done(index, reports[index])
        return [reports[index] for index in range(len(configs))]
    except BaseException:
        for ref in pending:
            ray.cancel(ref)
        raise
    finally:
        if started_here:
            ray.shutdown()


def _check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Fail at once when nothing listens at HOST:PORT (ray.init would retry for minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError) as error:
        raise RuntimeError(
            f"--ray {address}: cannot start or reach Ray: nothing answers at {host}:{port} "
            f"({error})"
        ) from None


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RuntimeError(
            "--ray needs Ray, which is not installed: pip install 'kvcentric[ray]'"
        ) from None
    return ray
