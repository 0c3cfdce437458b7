"""The live profile's decode points (measured batches as measured, larger ones grown from
the largest measured as the starting profile's measurement of the model grows) and its link
(fitted through the window's fetches, else the Conductor's measured pairs)."""

import json

import numpy as np
import pytest

from backend.observe.live_profile import (
    live_profile,
    pooled_inputs,
    profile_inputs,
    profile_of_inputs,
    with_parts,
)
from backend.policy.calibration import (
    Calibrator,
    DecodeStepSample,
    HostCpuSample,
    PrefillSample,
)
from backend.policy.cost_model import CostModel, DecodeFit, LinkModel, PrefillFit, fit_decode
from backend.rpc.reports import Join

# The starting profile: 2 ms a step plus 0.5 ms per request (what the idle profiling saw).
BASE = CostModel(PrefillFit(0.01, 1e-4), DecodeFit(0.002, 0.0005, 0.0), LinkModel(1e9), 2048)
AGENTS = [
    Join(0, "p0", "prefill", "10.0.0.1:1", "", "tcp", "tiny", 16, 10**6, 10**9, 0),
    Join(0, "d0", "decode", "10.0.0.2:2", "", "tcp", "tiny", 16, 5 * 10**5, 10**9, 0),
]


def _window() -> Calibrator:
    """Batches 1-4 measured three times slower than the base and growing steeply at small
    batches (a window's fit over them gives far more per request than larger ones cost)."""
    calibrator = Calibrator(BASE)
    seconds = {1: 0.004, 2: 0.009, 3: 0.011, 4: 0.012}  # 3 x base at batch 4
    now_s = 0.0
    for n in range(10):
        for batch, step_s in seconds.items():
            now_s += step_s
            calibrator.add_decode([DecodeStepSample(now_s, batch, 300 + 40 * n, step_s)])
    for n in range(25):
        calibrator.add_prefill([PrefillSample(100.0 + n, 100 + 10 * n, 0, 0.02 + 1e-4 * n)])
    return calibrator


def test_batches_beyond_the_window_grow_as_the_starting_profile_measured() -> None:
    profile = live_profile(_window(), AGENTS)
    rows: dict[int, list[dict]] = {}
    for point in profile["decode_points"]:
        rows.setdefault(point["batch_size"], []).append(point)
    assert rows[4][0]["seconds"] == pytest.approx(0.012)  # measured: as measured
    scale = 0.012 / BASE.decode.step_s(4, rows[4][0]["context_tokens"])
    for batch in (8, 16, 64):
        for point in rows[batch]:
            expected = scale * BASE.decode.step_s(batch, point["context_tokens"])
            assert point["seconds"] == pytest.approx(expected)
    window_fit = fit_decode(
        [(s.batch_size, s.context_tokens, s.seconds) for s in _window().decode], robust=True
    )
    assert rows[8][0]["seconds"] < 0.85 * window_fit.step_s(8, rows[8][0]["context_tokens"])


def test_the_link_is_the_one_the_fetches_measured() -> None:
    """Without fetches in the window to fit, the Conductor's measured pairs set the
    profile's link (their median bandwidth); with none measured, or none that took time,
    the believed link stays."""
    assert live_profile(_window(), AGENTS)["link"]["bandwidth_bytes_per_s"] == 1e9
    measured = [
        {"source": "p0", "destination": "p1", "bandwidth_bytes_per_s": 2e8, "num_measurements": 4},
        {"source": "p1", "destination": "p0", "bandwidth_bytes_per_s": 4e8, "num_measurements": 2},
        {"source": "p1", "destination": "p2", "bandwidth_bytes_per_s": 9e8, "num_measurements": 1},
        {"source": "p2", "destination": "p0", "bandwidth_bytes_per_s": None, "num_measurements": 1},
    ]
    profile = live_profile(_window(), AGENTS, links=measured)
    assert profile["link"] == {"bandwidth_bytes_per_s": 4e8, "latency_s": 0.0}
    assert profile["measured_from"]["link"] == "3 measured pair(s)"
    unusable = live_profile(_window(), AGENTS, links=measured[3:])
    assert unusable["link"]["bandwidth_bytes_per_s"] == 1e9
    assert unusable["measured_from"]["link"] == "believed"


def _with_fetches(fetches: list[tuple[int, float]]) -> Calibrator:
    """The window plus prefills that fetched (tokens, seconds fetching)."""
    calibrator = _window()
    for n, (tokens, fetch_s) in enumerate(fetches):
        sample = PrefillSample(200.0 + n, 400, tokens, 0.05 + fetch_s, 0.0, tokens, None, fetch_s)
        calibrator.add_prefill([sample])
    return calibrator


def test_the_link_is_fitted_through_the_fetches_latency_and_bandwidth_apart() -> None:
    """Each fetch costs 3 ms plus its bytes at 50 MB/s, two of them stalled: the fit finds
    both terms (a bandwidth of bytes over seconds would fold the 3 ms into it and swing with
    the sizes fetched), and it overrides the pairs' estimates."""
    sizes = [16, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512]
    fetches = [(tokens, 0.003 + tokens * 2048 / 50e6) for tokens in sizes]
    fetches[3] = (64, 0.2)  # a fetch behind a long stall
    fetches[7] = (192, 0.5)
    pairs = [
        {"source": "p0", "destination": "p1", "bandwidth_bytes_per_s": 8e6, "num_measurements": 3}
    ]
    profile = live_profile(_with_fetches(fetches), AGENTS, links=pairs)
    assert profile["link"]["bandwidth_bytes_per_s"] == pytest.approx(50e6, rel=0.02)
    assert profile["link"]["latency_s"] == pytest.approx(0.003, rel=0.05)
    assert profile["measured_from"]["link"] == "12 fetches fitted"


@pytest.mark.parametrize(
    "fetches",
    [
        [(tokens, 0.003 + tokens * 4e-5) for tokens in range(16, 160, 16)],  # 9: too few
        [(64, 0.004 + n * 1e-4) for n in range(12)],  # one size: latency or bandwidth?
        [(tokens, 0.05 - tokens * 1e-5) for tokens in range(16, 208, 16)],  # faster if larger
    ],
    ids=["too-few", "one-size", "no-growth"],
)
def test_fetches_that_cannot_tell_the_bandwidth_measure_the_latency(fetches) -> None:
    """The per-fetch cost is what they measure (beyond their bytes at the believed
    bandwidth); the pairs' per-byte estimates, which fold it into the bandwidth, are not
    used."""
    pairs = [
        {"source": "p0", "destination": "p1", "bandwidth_bytes_per_s": 8e6, "num_measurements": 3}
    ]
    profile = live_profile(_with_fetches(fetches), AGENTS, links=pairs)
    beyond = sorted(seconds - tokens * 2048 / 1e9 for tokens, seconds in fetches)
    assert profile["link"]["bandwidth_bytes_per_s"] == 1e9
    assert profile["link"]["latency_s"] == pytest.approx(float(np.median(beyond)))
    assert profile["measured_from"]["link"] == (
        f"{len(fetches)} fetch(es): latency measured, bandwidth believed"
    )


def test_a_profile_is_built_again_from_its_kept_inputs() -> None:
    """What `twin repredict --rebuild-profile` rests on: the inputs, through JSON, give the
    very profile live built; malformed ones are a clear error."""
    links = [
        {"source": "p0", "destination": "p1", "bandwidth_bytes_per_s": 2e8, "num_measurements": 4}
    ]
    window = _window()
    inputs = json.loads(json.dumps(profile_inputs(window, AGENTS, links)))
    assert len(inputs["window"]["decode"]) == len(window.decode)
    assert profile_of_inputs(inputs) == live_profile(window, AGENTS, links=links)
    with pytest.raises(ValueError, match="inputs are malformed"):
        profile_of_inputs({**inputs, "agents": [{"role": "prefill"}]})


def test_a_profile_takes_the_named_parts_of_another_and_keeps_the_rest() -> None:
    """`twin repredict --hindsight-of decode`: the window's decode measurements in the
    warm-up's profile, nothing else of the window's."""
    warmup = {
        "name": "live",
        "prefill_points": [1],
        "decode_points": [2],
        "link": {"latency_s": 0.01},
        "host": {"prefill_cores": 1.3, "decode_cores": 2.3, "decode_length": {"exponent": 0.05}},
        "spread": {"prefill_rate_3": [0.5], "decode_rate_3": [0.9], "decode_pause_2": [1e-4]},
    }
    window = {
        "name": "live",
        "prefill_points": [10],
        "decode_points": [20],
        "link": {"latency_s": 0.02},
        "host": {"prefill_cores": 1.4, "decode_cores": 2.0},  # no decode_length measured
        "spread": {"prefill_rate_3": [0.6], "decode_rate_2": [0.8], "decode_rate_3": [0.7]},
    }
    merged = with_parts(warmup, window, ["decode"])
    assert merged["decode_points"] == [20] and merged["prefill_points"] == [1]
    assert merged["host"] == {"prefill_cores": 1.3, "decode_cores": 2.0}  # the window's lack too
    assert merged["spread"] == {
        "prefill_rate_3": [0.5],
        "decode_rate_2": [0.8],
        "decode_rate_3": [0.7],
    }
    assert merged["link"] == {"latency_s": 0.01}
    assert warmup["host"]["decode_cores"] == 2.3  # neither profile is changed
    assert with_parts(warmup, window, ["decode", "prefill", "link"])["link"] == window["link"]
    assert with_parts(warmup, window, []) == warmup
    with pytest.raises(ValueError, match="unknown profile part 'decoder'; the parts are prefill"):
        with_parts(warmup, window, ["decoder"])


def _shared_host_window(seed: int) -> Calibrator:
    """A prefill and a decode agent on one host, each computation with its CPU time, the
    host's counters read each second: what one run's warm-up holds."""
    rng = np.random.default_rng(seed)
    calibrator = Calibrator(BASE)
    now_s = busy_s = 0.0
    for n in range(60):
        solo_s = 0.02 + 0.01 * rng.random()
        calibrator.add_prefill(
            [PrefillSample(now_s + solo_s * 1.6, 200 + 20 * n, 0, solo_s * 1.6, cpu_s=solo_s)]
        )
        for k in range(4):  # decode steps beside it, slowed as much
            step_end_s = now_s + 0.01 * (k + 1)
            calibrator.add_decode(
                [DecodeStepSample(step_end_s, 1 + k, 300 * (1 + k), 0.01, cpu_s=0.006 + 0.001 * k)]
            )
        now_s += 0.1
        busy_s += 0.09
        if n % 10 == 0:
            calibrator.add_host_cpu([HostCpuSample(now_s, "h", 2, busy_s, 2 * now_s)])
    # Read after the last prefill: not over the prefills' span (`host_other`).
    calibrator.add_host_cpu([HostCpuSample(now_s + 5.0, "h", 2, busy_s + 1.0, 2 * now_s + 10)])
    return calibrator


SHARED = [
    Join(0, "p0", "prefill", "127.0.0.1:1", "", "tcp", "tiny", 16, 10**6, 10**9, 0),
    Join(0, "d0", "decode", "127.0.0.1:2", "", "tcp", "tiny", 16, 5 * 10**5, 10**9, 0),
]


def test_warmups_pooled_keep_each_run_apart_and_its_own_beliefs() -> None:
    """`twin validate --pool-warmups`: the other runs' samples join the window moved to
    after it (their computations overlap none of this run's, so the host's sharing is
    measured within each run), this run's beliefs and host counters are its own, and a run
    pooled with a copy of itself measures the host and the times as it did alone."""
    own = json.loads(json.dumps(profile_inputs(_shared_host_window(0), SHARED)))
    other = json.loads(json.dumps(profile_inputs(_shared_host_window(1), SHARED)))
    pooled = pooled_inputs(own, [other])
    window = pooled["window"]
    assert len(window["prefill"]) == 120 and len(window["decode"]) == 480
    own_end_s = max(s["time_s"] for s in own["window"]["decode"])
    moved = window["decode"][240:]
    assert min(s["time_s"] - s["seconds"] for s in moved) > own_end_s
    assert window["host_cpu"] == own["window"]["host_cpu"][:-1]  # its own, over its prefills
    assert pooled["window"]["cost"] == own["window"]["cost"]
    assert own["window"]["decode"][0]["time_s"] < 1.0  # neither run's inputs changed
    alone = profile_of_inputs(own)
    doubled = profile_of_inputs(pooled_inputs(own, [own]))
    for key in ("host", "decode_points", "prefill_points"):
        assert _rounded(doubled[key]) == _rounded(alone[key]), key
    # The spread's quantiles are of twice the samples (a busy count seen too rarely alone
    # may now have its own), each the same at its middle.
    assert set(alone["spread"]) <= set(doubled["spread"])
    for key, quantiles in alone["spread"].items():
        middle = len(quantiles) // 2
        assert doubled["spread"][key][middle] == pytest.approx(quantiles[middle], rel=0.05), key
    assert doubled["measured_from"]["num_decode_samples"] == 480
    assert profile_of_inputs(pooled)["host"] != alone["host"]  # the other run counts
    # Another run on a host 1.5 times faster than this one's: its times at this one's speed.
    slowed = pooled_inputs(own, [other], [1.5])["window"]["decode"][240:]
    for before, after in zip(moved, slowed, strict=True):
        assert after["seconds"] == pytest.approx(1.5 * before["seconds"])
        assert after["cpu_s"] == pytest.approx(1.5 * before["cpu_s"])
    span = [s["time_s"] for s in moved]
    assert slowed[-1]["time_s"] - slowed[0]["time_s"] == pytest.approx(1.5 * (span[-1] - span[0]))


def _rounded(value, digits: int = 9):
    """`value` with every float rounded (sums over duplicated samples differ in the last bits)."""
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, dict):
        return {k: _rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v, digits) for v in value]
    return value
