"""The host's speed over a validate run's warm-up and window (backend/bench/host_speed.py)."""

import numpy as np
import pytest

from backend.bench.host_speed import (
    MIN_PREFILLS,
    host_speeds,
    prefill_samples,
    relative_speeds,
    summary,
)


def _prefills(rng, count, start_s, slowness, *, with_cpu=True):
    """Prefills of the prefill form's shape, each `slowness` times its model time."""
    samples = []
    for k in range(count):
        inputs = int(rng.integers(50, 2000))
        cached = int(rng.integers(0, inputs // 2))
        new = inputs - cached
        model_s = 0.01 + 1e-4 * new + 7e-8 * new * (inputs + cached) / 2
        cpu_s = model_s * slowness * float(rng.uniform(0.97, 1.03))
        samples.append(
            {
                "time_s": start_s + k,
                "input_tokens": inputs,
                "cached_tokens": cached,
                "seconds": cpu_s * 1.6,  # waits for the cores beside the computation
                "cpu_s": cpu_s if with_cpu else None,
                "queue_s": 0.0,
            }
        )
    return samples


def test_a_window_slower_than_its_warmup_drifts_by_that_much():
    rng = np.random.default_rng(0)
    steady = _prefills(rng, 60, 1000.0, 1.0) + _prefills(rng, 120, 1060.0, 1.0)
    slower = _prefills(rng, 60, 1000.0, 1.0) + _prefills(rng, 120, 1060.0, 1.12)
    speeds = host_speeds([(steady, 1060.0), (slower, 1060.0)])
    assert speeds[0]["drift"] == pytest.approx(1.0, abs=0.02)
    assert speeds[1]["drift"] == pytest.approx(1.12, abs=0.03)
    # One yardstick for the set: the slower window reads slower than the steady one's.
    assert speeds[1]["window"] > speeds[0]["window"] * 1.08
    config = summary(speeds)
    assert config["runs"] == speeds
    assert config["drift"] == pytest.approx(np.median([s["drift"] for s in speeds]), abs=1e-3)


def test_runs_without_enough_measured_prefills_have_no_speed():
    rng = np.random.default_rng(1)
    enough = _prefills(rng, 40, 0.0, 1.0) + _prefills(rng, 40, 100.0, 1.0)
    short_window = _prefills(rng, 40, 0.0, 1.0) + _prefills(rng, MIN_PREFILLS - 1, 100.0, 1.0)
    unclocked = _prefills(rng, 40, 0.0, 1.0, with_cpu=False) + _prefills(
        rng, 40, 100.0, 1.0, with_cpu=False
    )
    speeds = host_speeds([(enough, 100.0), (short_window, 100.0), (unclocked, 100.0), ((), 0.0)])
    assert speeds[0] is not None
    assert speeds[1:] == [None, None, None]
    assert summary([None, None]) is None
    assert host_speeds([(unclocked, 100.0)]) == [None]


def test_prefill_samples_reads_the_calibration_as_of_the_windows_end():
    sample = {"time_s": 1.0, "input_tokens": 10, "cached_tokens": 0, "seconds": 0.1, "cpu_s": 0.1}
    live = {"calibration_after": {"profile_inputs": {"window": {"prefill": [sample]}}}}
    assert prefill_samples(live) == [sample]
    assert prefill_samples({"calibration_after": {}}) == []
    assert prefill_samples({}) == []


def test_warmups_pooled_at_one_speed_read_each_runs_speed_against_one_yardstick():
    """What `validate --pool-warmups` scales the earlier warm-ups by."""
    rng = np.random.default_rng(2)
    runs = [_prefills(rng, 60, 0.0, 1.0), _prefills(rng, 60, 0.0, 1.25), _prefills(rng, 5, 0.0, 1)]
    speeds = relative_speeds(runs)
    assert speeds[1] / speeds[0] == pytest.approx(1.25, abs=0.03)
    assert speeds[2] is None  # too few prefills for a speed of its own
    assert relative_speeds([runs[2]]) == [None]
