"""`kvcentric profile --quick` on the tiny preset: real measurements that both readers load.

One quick profile (about 10 s on two cores) is measured for the whole module; the twin
then replays the first 50 rows of the shipped trace on it.
"""

import json

import pytest
from typer.testing import CliRunner

from agents.model import get_preset
from backend.cli import app
from backend.policy import CostModel
from backend.traces import SHIPPED_TRACE
from backend.traces.loader import load_trace
from twin.config import TwinConfig
from twin.measured import MeasuredTiming
from twin.run import simulate
from twin.timing import load_timing

runner = CliRunner()


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("profile") / "tiny.json"
    result = runner.invoke(app, ["profile", "--preset", "tiny", "--out", str(path), "--quick"])
    assert result.exit_code == 0, result.output
    assert result.stdout == ""  # the progress bar and the summary go to stderr
    assert f"wrote {path}" in result.stderr
    return path


@pytest.fixture(scope="module")
def profile(profile_path):
    return json.loads(profile_path.read_text())


def test_the_policy_fits_its_cost_model_from_the_points(profile):
    cost = CostModel.from_profile(profile)
    assert cost.name == "tiny-cpu"
    assert cost.kv_bytes_per_token == get_preset("tiny").kv_bytes_per_token(4) == 2048
    assert cost.prefill_time_s(2048, 0) > cost.prefill_time_s(256, 0) > 0
    assert cost.decode_step_time_s(16, 16 * 4096) > 0
    assert cost.link.bandwidth_bytes_per_s > 1e6
    assert 0 <= cost.link.latency_s < 0.1


def test_the_twin_loads_it_as_measured_timing(profile_path, profile):
    timing = load_timing(str(profile_path))
    assert isinstance(timing, MeasuredTiming)
    assert len(timing.prefill_points) == 9 and len(timing.decode_points) == 6
    assert timing.storage.dram_read_bytes_per_s > timing.storage.ssd_read_bytes_per_s > 0
    assert timing.instance.decode_kv_capacity_tokens > 16 * 4096
    measured = profile["measured"]
    assert {"cpu_model", "num_cores", "torch", "device", "date"} <= measured["machine"].keys()
    for figure in ("dram_store_us_per_block", "dram_load_us_per_block", "ssd_load_us_per_block"):
        assert measured["pool"][figure] > 0
    assert measured["block_bytes"] == 64 * 2048


def test_a_short_twin_run_completes_on_it(profile_path):
    rows = load_trace(SHIPPED_TRACE)[:50]
    config = TwinConfig(profile=str(profile_path), num_prefill=1, num_decode=1)
    report = simulate(config, rows)
    assert report["num_requests"] == 50
    assert report["num_completed"] + report["num_rejected"] + report["num_failed"] == 50
    assert report["num_completed"] > 0


def test_prefill_grows_with_input_and_shrinks_with_cached_tokens(profile):
    seconds = {
        (p["input_tokens"], p["cached_tokens"]): p["seconds"] for p in profile["prefill_points"]
    }
    longest = max(inputs for inputs, _ in seconds)
    shortest = min(inputs for inputs, _ in seconds)
    most_cached = max(cached for inputs, cached in seconds if inputs == longest)
    assert most_cached == 1792  # 0.9 of 2048 in whole 64-token blocks
    assert seconds[(longest, 0)] > seconds[(shortest, 0)]
    assert seconds[(longest, most_cached)] < seconds[(longest, 0)]


def test_decode_points_count_the_batch_total_context(profile):
    points = profile["decode_points"]
    for point in points:
        assert point["context_tokens"] == point["batch_size"] * point["context_per_request_tokens"]
    by_shape = {(p["batch_size"], p["context_per_request_tokens"]): p["seconds"] for p in points}
    assert by_shape[(16, 4096)] > by_shape[(1, 256)]


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--preset", "huge"], "unknown model 'huge': not a dummy preset (tiny"),
        (["--out", "/nonexistent-dir/profile.json"], "does not exist"),
        (["--out", "."], "is a directory"),
        (["--ssd-dir", "/nonexistent-ssd"], "--ssd-dir /nonexistent-ssd is not a directory"),
        (["--decode-kv-capacity-tokens", "100"], "fewer than three decode shapes"),
    ],
)
def test_bad_inputs_are_one_line_on_stderr_with_exit_2(tmp_path, args, problem):
    out = ["--out", str(tmp_path / "p.json")] if "--out" not in args else []
    result = runner.invoke(app, ["profile", "--quick", *out, *args])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert problem in result.stderr
    assert not (tmp_path / "p.json").exists()
