"""The twin end to end: invariants, determinism, the real policy inside, cache-sim parity."""

import dataclasses
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

import backend.policy.core as policy_core
from backend.traces.cache_sim import simulate_cache
from backend.traces.loader import load_trace
from twin.config import TwinConfig
from twin.report import dumps_report
from twin.run import simulate

EXPECTED_DIR = Path(__file__).parent / "expected"
SMALL = TwinConfig(num_prefill=2, num_decode=2, seed=7, series_interval_s=10.0)


@pytest.fixture(scope="module")
def first_minutes(shipped_trace):
    """The first three minutes of the shipped trace (about 600 requests)."""
    return load_trace(shipped_trace, minutes=(0.0, 3.0))


def comparable(report: dict) -> str:
    return dumps_report({**report, "sim_wall_s": None})


def test_every_request_ends_once_and_tokens_add_up(first_minutes) -> None:
    report = simulate(SMALL.with_changes(speed=4.0, rejection="baseline"), first_minutes)
    rows = report["requests"]
    assert report["num_requests"] == len(first_minutes) == len(rows)
    assert (
        report["num_completed"] + report["num_rejected"] + report["num_failed"]
        == report["num_requests"]
    )
    assert report["num_rejected"] > 0  # 4x overload on 2P+2D: the check must bite
    assert {row["outcome"] for row in rows} <= {"completed", "rejected", "failed"}
    completed = [row for row in rows if row["outcome"] == "completed"]
    # tokens in = tokens out: every completed request produced exactly its output tokens,
    # and every admitted prompt token was either reused or computed.
    assert report["num_output_tokens"] == sum(row["output_tokens"] for row in completed)
    assert all(row["ttft_s"] is not None and row["ttft_s"] > 0 for row in completed)
    pool = report["pool"]
    assert pool["max_dram_blocks"] <= pool["dram_capacity_blocks"]
    assert pool["max_ssd_blocks"] <= pool["ssd_capacity_blocks"]
    assert sum(report["rejected_by_reason"].values()) == report["num_rejected"]


def test_small_pools_evict_without_touching_pinned_blocks(first_minutes) -> None:
    # Tiny shards force constant eviction and demotion while requests pin what they reuse;
    # the shard raises if a pinned block is ever evicted, the run checks the capacities.
    config = SMALL.with_changes(dram_capacity_blocks=64, ssd_capacity_blocks=64, eviction="lfu")
    report = simulate(config, first_minutes)
    assert report["pool"]["max_dram_blocks"] == 64
    assert report["num_completed"] + report["num_rejected"] == report["num_requests"]


def test_same_seed_same_report_byte_for_byte(first_minutes) -> None:
    config = SMALL.with_changes(noise=0.1)
    first = comparable(simulate(config, first_minutes))
    assert comparable(simulate(config, first_minutes)) == first
    assert comparable(simulate(config.with_changes(seed=8), first_minutes)) != first


def test_report_matches_the_stored_expected_report(first_minutes) -> None:
    """Regenerate with KVC_UPDATE_EXPECTED=1 after an intended change, and say why in the commit."""
    import os

    path = EXPECTED_DIR / "small-2p2d-3min.json"
    actual = json.loads(comparable(simulate(SMALL, first_minutes)))
    if os.environ.get("KVC_UPDATE_EXPECTED"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(actual, sort_keys=True, indent=1) + "\n")
    expected = json.loads(path.read_text())
    for key in ("requests", "series"):
        assert actual.pop(key) == expected.pop(key), key
    assert actual == expected


def test_the_policy_learns_the_twins_links_from_its_fetches(first_minutes) -> None:
    """As live learns each pair from the agents' fetches (backend.policy.links), the twin's
    policy learns them from the twin's: here every link is the profile's, and so is the
    belief."""
    config = SMALL.with_changes(threshold=1.0)
    report = simulate(config, first_minutes)
    assert report["num_transferred_tokens"] > 0
    links = report["links"]
    assert links and all(row["num_measurements"] >= 1 for row in links)
    profile = report["policy_cost_model"]["link"]["bandwidth_bytes_per_s"]
    for row in links:
        assert row["bandwidth_bytes_per_s"] == pytest.approx(profile, rel=1e-6)


def test_the_twin_runs_the_real_policy_code(first_minutes, monkeypatch) -> None:
    baseline = simulate(SMALL, first_minutes)
    calls = []
    real_route = policy_core.route_prefill

    def always_first_instance(candidates, *args, **kwargs):
        calls.append(len(candidates))
        return real_route(candidates[:1], *args, **kwargs)

    monkeypatch.setattr(policy_core, "route_prefill", always_first_instance)
    changed = simulate(SMALL, first_minutes)
    assert len(calls) == len(first_minutes)
    assert {row["prefill_instance"] for row in changed["requests"] if row["prefill_instance"]} == {
        "prefill-00"
    }
    assert changed["ttft_mean_s"] != baseline["ttft_mean_s"]


@pytest.mark.parametrize("policy", ["lru", "lfu", "length-aware"])
def test_one_instance_without_transfers_hits_exactly_like_cache_sim(shipped_trace, policy) -> None:
    # The same 400 requests for both: whole blocks only (the live system keys full blocks),
    # one a minute, so each prefill (at most 36 s) ends before the next request arrives, as
    # cache-sim assumes. One prefill instance, no SSD, a pool that must evict.
    rows = [
        replace(row, timestamp_ms=60_000 * n, input_length=len(row.hash_ids) * 512)
        for n, row in enumerate(load_trace(shipped_trace)[:400])
    ]
    capacity_blocks = 1000
    config = TwinConfig(
        num_prefill=1,
        num_decode=1,
        scheduler="cache-aware",
        rejection="none",
        eviction=policy,
        dram_capacity_blocks=capacity_blocks,
        ssd_capacity_blocks=0,
        series_interval_s=1e5,
    )
    report = simulate(config, rows)
    expected = simulate_cache(rows, policy, capacity_blocks)
    assert report["num_completed"] == len(rows)
    assert expected["evictions"] > 0 and expected["hits"] > 0
    assert report["block_hit_ratio"] == expected["hit_ratio"]


def test_chunked_pipeline_groups_cut_the_ttft_of_long_prompts(shipped_trace) -> None:
    # Long prompts one at a time: on a group of 2 instances a prompt of C chunks takes
    # (C + 1) / (2 C) of its single-instance time; short prompts would not use the group.
    long_rows = [row for row in load_trace(shipped_trace) if row.input_length > 64_000][:20]
    rows = [replace(row, timestamp_ms=120_000 * n) for n, row in enumerate(long_rows)]
    alone = TwinConfig(num_prefill=2, num_decode=1, rejection="none", prefill_chunk_tokens=8192)
    piped = alone.with_changes(pipeline_group=2)
    ttft_alone = simulate(alone, rows)["ttft_mean_s"]
    ttft_piped = simulate(piped, rows)["ttft_mean_s"]
    assert 0.45 * ttft_alone < ttft_piped < 0.65 * ttft_alone


def test_a_calibrating_twin_comes_to_believe_the_times_it_runs(shipped_trace, tmp_path) -> None:
    """A profile whose Conductor believed every prefill ten times too fast: with `calibrate`
    the twin's core refits from the twin's own measurements, as live does, and then
    predicts the prefills it ran (median error) closely; without, it stays ten times off."""
    import numpy as np

    from backend.policy.cost_model import CostModel
    from twin.timing import load_timing, read_profile

    data, _ = read_profile("tiny-cpu")
    truth = CostModel.from_profile(data)
    fast = {k: v / 10 for k, v in dataclasses.asdict(truth.prefill).items()}
    wrong = replace(truth, prefill=replace(truth.prefill, **fast), name="ten-times-too-fast")
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({**data, "believed": wrong.to_profile()}))
    rows = load_trace(shipped_trace, minutes=(0.0, 2.0))
    config = TwinConfig(num_prefill=2, num_decode=1, profile=str(path), seed=3)
    timing = load_timing(str(path))

    def median_error(report: dict) -> float:
        believed = CostModel.from_profile(report["policy_cost_model_end"])
        ran = [
            (r["input_tokens"], r["reused_tokens"])
            for r in report["requests"]
            if r["prefill_instance"] is not None
            and timing.prefill_s(r["input_tokens"], r["reused_tokens"]) > 0
        ]
        return float(
            np.median([abs(believed.prefill_time_s(*p) / timing.prefill_s(*p) - 1) for p in ran])
        )

    calibrated = simulate(config.with_changes(calibrate=True), rows)
    assert calibrated["num_refits"] > 3
    assert median_error(calibrated) < 0.1
    fixed = simulate(config, rows)
    assert fixed["num_refits"] == 0
    assert fixed["policy_cost_model_end"] == fixed["policy_cost_model"]
    assert median_error(fixed) > 0.8


def test_a_twin_takes_over_lives_calibration_at_the_windows_start(shipped_trace, tmp_path):
    """Predicting a live window, the twin believes what live's Conductor believed as the
    window began and refits when live's next refit was due, on live's measurements of the
    warm-up and its own of the window: its replay of the warm-up refits nothing."""
    from backend.policy.calibration import (
        CalibrationConfig,
        Calibrator,
        DecodeStepSample,
        PrefillSample,
    )
    from backend.policy.cost_model import CostModel
    from twin.cluster import LiveCalibration
    from twin.timing import load_timing, read_profile

    data, _ = read_profile("tiny-cpu")
    truth = CostModel.from_profile(data)
    slow = {k: v * 2 for k, v in dataclasses.asdict(truth.prefill).items()}
    believed = replace(truth, prefill=replace(truth.prefill, **slow), name="twice-too-slow")
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({**data, "believed": believed.to_profile()}))
    timing = load_timing(str(path))
    live = Calibrator(believed)
    live.add_prefill(
        PrefillSample(0.1 * n, 50 + 20 * n, 0, timing.prefill_s(50 + 20 * n, 0)) for n in range(30)
    )
    live.add_decode(DecodeStepSample(0.05 * n, 1 + n % 4, 200, 0.004) for n in range(60))
    live.num_refits = 5  # what live's Conductor had done by the window's start
    live.fitted_points = {"prefill": 30, "decode": 60}  # its last fit was of these
    state = json.loads(json.dumps(live.to_state()))
    rows = load_trace(shipped_trace, minutes=(0.0, 0.6))  # nine seconds at speed 4
    config = TwinConfig(
        num_prefill=2, num_decode=1, profile=str(path), seed=3, calibrate=True, speed=4.0
    )

    def predict(last_refit_s: float, rules: CalibrationConfig | None = None) -> dict:
        taken = LiveCalibration(state, last_refit_s=last_refit_s, from_s=4.0, config=rules)
        return simulate(config, rows, measure_from_s=4.0, live_calibration=taken)

    on_its_own = simulate(config, rows, measure_from_s=4.0)
    assert on_its_own["num_refits"] >= 1  # on its replay of the warm-up
    assert on_its_own["policy_cost_model_end"] != believed.to_profile()
    # Live refit 10 ms before the window: the twin refits when live's next was due, 10 s
    # on, or once its points doubled since live's fit; had live not refit, at once as well.
    not_due = predict(last_refit_s=3.99)
    due = predict(last_refit_s=-math.inf)
    assert not_due["num_refits"] >= 5 + 1 and due["num_refits"] == not_due["num_refits"] + 1
    # Live's own rules hold in the twin: had live refitted by the interval alone, once.
    by_interval = predict(last_refit_s=3.99, rules=CalibrationConfig(refit_growth=1e9))
    assert by_interval["num_refits"] == 5 + 1
    refit = CostModel.from_profile(due["policy_cost_model_end"])
    assert refit.prefill_time_s(500, 0) < 0.8 * believed.prefill_time_s(500, 0)


def test_a_twin_replaying_lives_warm_up_believes_what_live_believed_then(shipped_trace, tmp_path):
    """Before the window the twin's Conductor believes each model live believed, from when
    live did: requests near an SLO are judged by the model of their moment, not by the one
    the warm-up ended with."""
    from backend.policy.calibration import Calibrator
    from backend.policy.cost_model import CostModel
    from backend.traces.arrivals import arrivals_from_rows
    from twin.cluster import LiveCalibration
    from twin.timing import read_profile

    data, _ = read_profile("tiny-cpu")
    truth = CostModel.from_profile(data)
    hopeless = replace(truth, prefill=replace(truth.prefill, fixed_s=5000.0), name="hopeless")
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({**data, "believed": truth.to_profile()}))
    state = json.loads(json.dumps(Calibrator(truth).to_state()))
    rows = load_trace(shipped_trace, minutes=(0.0, 0.6))  # nine seconds at speed 4
    config = TwinConfig(
        num_prefill=2, num_decode=1, profile=str(path), seed=3, calibrate=True, speed=4.0,
        ttft_slo_s=1000.0, tbt_slo_s=10.0,
    )  # fmt: skip

    def refused_before(beliefs) -> list[float]:
        taken = LiveCalibration(state, last_refit_s=-math.inf, from_s=4.0, beliefs=beliefs)
        report = simulate(config, rows, live_calibration=taken)
        return [r["arrival_s"] for r in report["requests"] if r["outcome"] == "rejected"]

    arrivals = [a.now_s for a in arrivals_from_rows(rows, block_size=16, speed=4.0)]
    assert refused_before(None) == []  # the warm-up's end's model throughout: all taken
    # Live believed a hopeless model until its refit 2 s in: the twin refuses until then.
    refused = refused_before([(-math.inf, hopeless), (2.0, truth)])
    assert refused == [t for t in arrivals if t < 2.0] and refused
