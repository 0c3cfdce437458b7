"""`twin sweep --ray`: the runs as Ray tasks on a local Ray instance give the same reports
as local processes, in order, with progress; a failing run and an unreachable cluster are
clear errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from backend.traces import SHIPPED_TRACE
from backend.traces.loader import load_trace
from twin.config import TwinConfig
from twin.sweep import expand_grid, run_sweep

pytest.importorskip("ray", reason="Ray is a test dependency: pip install -e '.[dev]'")
KVCENTRIC = str(Path(sys.executable).parent / "kvcentric")


def _comparable(report: dict) -> dict:
    return {key: value for key, value in report.items() if key != "sim_wall_s"}


def test_ray_tasks_give_the_reports_of_local_processes() -> None:
    rows = load_trace(SHIPPED_TRACE, minutes=(0.0, 1.0))
    configs = expand_grid(
        TwinConfig(num_prefill=2, num_decode=2), thresholds=[1.0, 2.0, float("inf")]
    )
    done: list[int] = []
    on_ray = run_sweep(
        configs, rows, workers=2, ray_address="local", on_done=lambda i, _: done.append(i)
    )
    local = run_sweep(configs, rows, workers=2)
    assert sorted(done) == [0, 1, 2]
    assert [_comparable(r) for r in on_ray] == [_comparable(r) for r in local]
    assert [r["config"]["threshold"] for r in on_ray] == [1.0, 2.0, "inf"]


def test_a_failing_run_is_raised_and_stops_the_sweep() -> None:
    rows = load_trace(SHIPPED_TRACE, minutes=(0.0, 0.5))
    bad = TwinConfig(num_prefill=1, num_decode=1, profile="no-such-profile")
    with pytest.raises(Exception, match="no-such-profile"):
        run_sweep([TwinConfig(), bad], rows, workers=2, ray_address="local")


def test_the_command_line_sweeps_on_ray_and_names_an_unreachable_cluster(tmp_path) -> None:
    out = tmp_path / "sweep"
    args = [KVCENTRIC, "twin", "sweep", "--minutes", "0:0.5", "--thresholds", "1,inf"]
    result = subprocess.run(
        [*args, "--ray", "local", "--workers", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(json.loads((out / "results.json").read_text())) == 2
    result = subprocess.run(
        [*args, "--ray", "127.0.0.1:1", "--out", str(tmp_path / "no")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith("error: --ray 127.0.0.1:1: cannot start or reach Ray")


def test_the_consoles_whatif_runs_on_ray_when_configured() -> None:
    """`kvcentric console --ray` reaches the What-if page's runs (KVC_CONSOLE_RAY_ADDRESS)."""
    from console.settings import ENV_RAY_ADDRESS, ConsoleSettings
    from console.whatif import run_whatif

    settings = ConsoleSettings.from_env({ENV_RAY_ADDRESS: "local"})
    assert settings.ray_address == "local"
    assert ConsoleSettings.from_env(settings.to_env()) == settings
    assert ConsoleSettings.from_env({}).ray_address is None
    rows = load_trace(SHIPPED_TRACE, minutes=(0.0, 0.5))
    current = TwinConfig(num_prefill=2, num_decode=2)
    candidate = current.with_changes(threshold=float("inf"))
    on_ray = run_whatif(current, candidate, rows, ray_address=settings.ray_address)
    local = run_whatif(current, candidate, rows)
    assert on_ray["deltas"] == local["deltas"]
