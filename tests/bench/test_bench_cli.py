"""`kvcentric bench` on small inputs: the JSON has its figures and the replay drains.

Speed is not asserted here; it belongs in docs/benchmarks.md.
"""

import itertools
import json
from pathlib import Path

from typer.testing import CliRunner

from backend.bench.policy_replay import PolicyReplay
from backend.cli import app
from backend.policy import ConductorCore, CostModel, PolicyConfig
from backend.traces.arrivals import arrivals_from_rows
from backend.traces.loader import iter_trace

runner = CliRunner()


def _run_json(*args: str) -> dict:
    result = runner.invoke(app, ["bench", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # stdout holds only the JSON object


def test_hashing_reports_speed_and_baseline() -> None:
    report = _run_json("hashing", "--tokens", "70000", "--block-size", "16", "--repeat", "2")
    assert report["block_size"] == 16
    assert report["num_tokens"] == 70000 // 16 * 16  # whole blocks only
    assert report["num_blocks"] == 70000 // 16
    assert report["tokens_per_s"] > 0
    assert report["best_tokens_per_s"] >= report["tokens_per_s"]
    assert report["baseline_tokens_per_s"] > 0
    assert report["ratio"] == report["tokens_per_s"] / report["baseline_tokens_per_s"]


def test_hashing_rejects_too_few_tokens() -> None:
    result = runner.invoke(app, ["bench", "hashing", "--tokens", "100", "--prompts", "8"])
    assert result.exit_code != 0


def test_policy_replay_drains_every_request() -> None:
    report = _run_json("policy", "--limit", "300", "--prefill", "4", "--decode", "4")
    assert report["num_requests"] == 300
    assert report["num_completed"] + report["num_rejected"] == report["num_requests"]
    assert report["num_in_flight_at_end"] == 0
    assert report["is_drained"] and report["baseline"]["is_drained"]
    assert sum(report["rejected_by_reason"].values()) == report["num_rejected"]
    assert report["num_accepted"] > 0
    # Each accepted request ran through at least arrival, prefill start/end and decode.
    assert report["num_core_events"] >= report["num_requests"] + 3 * report["num_accepted"]
    assert report["decisions_per_s"] > 0
    assert 0 < report["p50_us"] <= report["p99_us"] <= report["max_us"]
    assert 0.0 <= report["cache_hit_ratio"] <= 1.0
    assert report["baseline"]["scheduler"] == "load-balancing"
    assert report["ratio_to_baseline"] > 0


def test_policy_replay_reports_a_bad_trace_in_one_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["bench", "policy", "--trace", str(tmp_path / "missing.jsonl")])
    assert result.exit_code == 1
    assert "missing.jsonl" in result.output


def test_small_shards_evict_and_the_index_stays_exact(shipped_trace: Path) -> None:
    rows = list(itertools.islice(iter_trace(shipped_trace), 200))
    core = ConductorCore(PolicyConfig(block_size=512), CostModel.reference_70b())
    replay = PolicyReplay(
        core, num_prefill_instances=2, num_decode_instances=2, cache_capacity_blocks=64
    )
    result = replay.run(arrivals_from_rows(rows, block_size=512))
    assert result.is_drained
    all_keys = {key for row in rows for key in row.hash_ids}
    for instance_id, worker in replay.prefill.items():
        assert len(worker.cache) == 64  # the shard filled up and evicted
        assert core.index.num_blocks(instance_id) == len(worker.cache)
        for key in all_keys:
            assert (key in worker.cache) == (core.index.tier_of(instance_id, key) is not None)


def test_twin_speed_benchmark_runs_on_a_short_trace(shipped_trace, tmp_path) -> None:
    trace = tmp_path / "short.jsonl"
    with open(shipped_trace) as lines:
        trace.write_text("".join(line for _, line in zip(range(200), lines, strict=False)))
    result = CliRunner().invoke(
        app, ["bench", "twin", "--trace", str(trace), "--prefill", "2", "--decode", "2", "--json"]
    )
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    assert figures["num_requests"] == 200
    assert figures["num_completed"] + figures["num_rejected"] == 200
    assert figures["faster_than_real_time"] > 0 and figures["ratio_to_policy_replay"] > 0


def test_allocator_benchmark_reports_both_variants() -> None:
    report = _run_json("allocator", "--calls", "60", "--threads", "4")
    for variant in ("default", "steady"):
        assert report[f"{variant}_first_ms_per_100"] > 0
        assert report[f"{variant}_steady_ms_per_100"] > 0
        assert report[f"{variant}_first_over_steady"] > 0


def test_host_drift_reports_each_probe_window_by_window() -> None:
    report = _run_json("host-drift", "--duration-s", "1.2", "--window-s", "0.3")
    assert report["num_windows"] == 4
    for probe in ("decode", "compute", "memory"):
        figures = report[probe]
        assert figures["calls"] > 0 and figures["mean_ms"] > 0
        assert len(figures["windows"]) == 4
        # each window's mean over the run's: the call-weighted mean of them is 1
        assert min(figures["windows"]) <= 1.0 + 1e-3 and max(figures["windows"]) >= 1.0 - 1e-3
        assert figures["spread"] >= 1.0
        assert 0 <= figures["median_abs_err"] <= figures["max_abs_err"]
        assert 0 <= figures["share_over_10pct"] <= 1


def test_host_drift_names_a_window_too_long_for_one_prediction() -> None:
    result = runner.invoke(app, ["bench", "host-drift", "--duration-s", "2", "--window-s", "1"])
    assert result.exit_code == 2
    assert "holds 2 windows of 1 s; at least 3 are needed" in result.output
