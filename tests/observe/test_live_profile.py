"""The live profile's decode points (measured batches as measured, larger ones grown from
the largest measured as the starting profile's measurement of the model grows) and its link
(fitted through the window's fetches, else the Conductor's measured pairs)."""

import json

import numpy as np
import pytest

from backend.observe.live_profile import (
    live_profile,
    profile_inputs,
    profile_of_inputs,
    with_parts,
)
from backend.policy.calibration import Calibrator, DecodeStepSample, PrefillSample
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
