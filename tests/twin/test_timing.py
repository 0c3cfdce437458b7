"""The twin's timing models: roofline figures by hand, interpolation, noise, errors, policy fit."""

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from backend.settings.profiles import profile_path
from twin.measured import MeasuredTiming
from twin.roofline import RooflineTiming
from twin.timing import NoisyTiming, TimingModel, load_timing, policy_cost_model

# The paper profile's numbers, spelled out as in docs/twin-timing.md.
PARAMS = 69e9
EFFECTIVE_FLOPS = 8 * 312e12 * 0.45
EFFECTIVE_HBM = 8 * 2.039e12 * 0.8
PAIR_FLOPS = 4 * 64 * 128 * 80
OVERHEAD_S = 80 * 40e-6 + 0.002
KV_BYTES = 327_680


@pytest.fixture(scope="module")
def paper() -> RooflineTiming:
    timing = load_timing("paper")
    assert isinstance(timing, RooflineTiming)
    return timing


def measured_profile() -> dict[str, Any]:
    """A small measured grid: two cached rows, three batch rows."""
    return {
        "format": "kvcentric-profile/1",
        "name": "tiny-cpu",
        "kv_bytes_per_token": 4096,
        "link": {"bandwidth_bytes_per_s": 1e9, "latency_s": 1e-3},
        "instance": {
            "dram_capacity_bytes": 10**9,
            "ssd_capacity_bytes": 0,
            "decode_kv_capacity_tokens": 50_000,
        },
        "prefill_points": [
            {"input_tokens": 100, "cached_tokens": 0, "seconds": 0.10},
            {"input_tokens": 200, "cached_tokens": 0, "seconds": 0.22},
            {"input_tokens": 400, "cached_tokens": 0, "seconds": 0.50},
            {"input_tokens": 300, "cached_tokens": 200, "seconds": 0.14},
            {"input_tokens": 600, "cached_tokens": 200, "seconds": 0.60},
        ],
        "decode_points": [
            {"batch_size": 1, "context_tokens": 100, "seconds": 0.0090},
            {"batch_size": 1, "context_tokens": 1000, "seconds": 0.01035},
            {"batch_size": 4, "context_tokens": 400, "seconds": 0.0125},
            {"batch_size": 4, "context_tokens": 4000, "seconds": 0.0180},
            {"batch_size": 16, "context_tokens": 1600, "seconds": 0.0260},
            {"batch_size": 16, "context_tokens": 16000, "seconds": 0.0480},
        ],
    }


def test_roofline_prefill_by_hand(paper: RooflineTiming) -> None:
    pairs = 1024 * 1025 // 2
    expected_s = (1024 * 2 * PARAMS + pairs * PAIR_FLOPS) / EFFECTIVE_FLOPS + OVERHEAD_S
    assert paper.prefill_s(1024, 0) == pytest.approx(expected_s, rel=1e-12)
    assert paper.prefill_s(1024, 0) == pytest.approx(0.13224, rel=1e-4)
    # 8,192 new tokens after a 24,576-token cached prefix: positions 24576..32767.
    pairs = (32768 * 32769 - 24576 * 24577) // 2
    expected_s = (8192 * 2 * PARAMS + pairs * PAIR_FLOPS) / EFFECTIVE_FLOPS + OVERHEAD_S
    assert paper.prefill_s(32768, 24576) == pytest.approx(expected_s, rel=1e-12)
    # Fully cached: one token is computed and the pass is bound by reading the weights.
    floor_s = 2 * PARAMS / EFFECTIVE_HBM + OVERHEAD_S
    assert paper.prefill_s(512, 512) == pytest.approx(floor_s, rel=1e-12)
    assert paper.prefill_s(512, 9999) == paper.prefill_s(512, 512)


def test_roofline_decode_by_hand(paper: RooflineTiming) -> None:
    # Batch 1 over 12k tokens is memory bound: weights plus KV through HBM.
    memory_s = (2 * PARAMS + 12_288 * KV_BYTES) / EFFECTIVE_HBM
    assert paper.decode_step_s(1, 12_288) == pytest.approx(memory_s + OVERHEAD_S, rel=1e-12)
    # Batch 128 over 1k tokens each is compute bound.
    compute_s = (128 * 2 * PARAMS + 131_072 * PAIR_FLOPS) / EFFECTIVE_FLOPS
    assert compute_s > (2 * PARAMS + 131_072 * KV_BYTES) / EFFECTIVE_HBM
    assert paper.decode_step_s(128, 131_072) == pytest.approx(compute_s + OVERHEAD_S, rel=1e-12)
    assert paper.decode_step_s(0, 0) == 0.0


def test_paper_profile_constants(paper: RooflineTiming) -> None:
    assert paper.kv_bytes_per_token == KV_BYTES
    assert paper.instance.decode_kv_capacity_tokens == (640e9 - 138e9 - 64e9) // KV_BYTES
    assert paper.instance.dram_capacity_bytes == 10**12
    assert paper.transfer_s(512 * KV_BYTES) == pytest.approx(5e-5 + 512 * KV_BYTES / 100e9)
    assert paper.transfer_s(0) == 0.0
    assert paper.load_s(160 * 10**9, "dram") == pytest.approx(1.0)
    assert paper.load_s(20 * 10**9, "ssd") == pytest.approx(1.0)
    with pytest.raises(ValueError, match="tier"):
        paper.load_s(1, "tape")


@pytest.mark.parametrize("kind", ["roofline", "measured"])
def test_monotonic(kind: str, paper: RooflineTiming) -> None:
    timing: TimingModel = paper if kind == "roofline" else timing_of(measured_profile())
    inputs = [100, 200, 300, 400, 600, 1000, 8192, 65536]
    prefill = [timing.prefill_s(n, 0) for n in inputs]
    assert prefill == sorted(prefill) and len(set(prefill)) == len(prefill)
    cached = [timing.prefill_s(600, c) for c in (0, 100, 200, 300, 500)]
    assert cached == sorted(cached, reverse=True) and len(set(cached)) == len(cached)
    # A bigger batch (each request bringing its context) and a longer context take longer.
    by_batch = [timing.decode_step_s(b, b * 4000) for b in (1, 4, 16, 128)]
    by_context = [timing.decode_step_s(4, ctx) for ctx in (400, 4000, 40_000, 400_000)]
    for steps in (by_batch, by_context):
        assert steps == sorted(steps) and len(set(steps)) == len(steps)
    # At a fixed total context a memory-bound step does not shrink as the batch grows.
    same_context = [timing.decode_step_s(b, 64_000) for b in (1, 4, 16, 128)]
    assert same_context == sorted(same_context)


def timing_of(profile: dict[str, Any]) -> MeasuredTiming:
    return MeasuredTiming.from_profile(profile)


def test_measured_reproduces_and_interpolates_its_grid() -> None:
    profile = measured_profile()
    timing = timing_of(profile)
    for point in profile["prefill_points"]:
        assert timing.prefill_s(point["input_tokens"], point["cached_tokens"]) == point["seconds"]
    for point in profile["decode_points"]:
        assert (
            timing.decode_step_s(point["batch_size"], point["context_tokens"]) == (point["seconds"])
        )
    assert timing.prefill_s(300, 0) == pytest.approx(0.36)  # halfway between 200 and 400
    # 200 new tokens after 100 cached: halfway between row 0 (0.22 s at 200 new tokens) and
    # row 200 (0.14 s at 100 new, 0.60 s at 400 new: 0.14 + 0.46 / 3 at 200 new).
    assert timing.prefill_s(300, 100) == pytest.approx((0.22 + 0.14 + 0.46 / 3) / 2)
    assert timing.decode_step_s(1, 550) == pytest.approx(0.009675)
    # Batch 10 between rows 4 and 16, both read at 4,000 context tokens.
    row4, row16 = 0.018, 0.026 + 0.022 * (4000 - 1600) / (16000 - 1600)
    assert timing.decode_step_s(10, 4000) == pytest.approx((row4 + row16) / 2)
    # Beyond the grid the edge segments extend linearly.
    assert timing.prefill_s(800, 0) == pytest.approx(0.50 + 0.14 * 400 / 100)
    assert timing.transfer_s(10**9) == pytest.approx(1.001)
    assert timing.load_s(10**9, "ssd") == pytest.approx(1.0)  # no storage: link speed


def test_measured_extrapolation_never_negative() -> None:
    profile = measured_profile()
    profile["prefill_points"] = [
        {"input_tokens": 100, "cached_tokens": 0, "seconds": 0.01},
        {"input_tokens": 200, "cached_tokens": 0, "seconds": 0.50},
    ]
    profile["decode_points"] = [
        {"batch_size": 8, "context_tokens": 1000, "seconds": 0.001},
        {"batch_size": 9, "context_tokens": 1000, "seconds": 0.100},
    ]
    timing = timing_of(profile)
    assert timing.prefill_s(1, 0) == 0.0
    assert timing.prefill_s(150, 150) == 0.0
    assert timing.decode_step_s(1, 1000) == 0.0
    assert timing.decode_step_s(1, 0) == 0.0


def test_measured_profile_of_the_roofline_tracks_it(paper: RooflineTiming) -> None:
    profile = measured_profile()
    profile["prefill_points"] = [
        {"input_tokens": n, "cached_tokens": c, "seconds": paper.prefill_s(n, c)}
        for n in (1024, 4096, 16384, 65536)
        for c in (0, n // 2)
    ]
    timing = timing_of(profile)
    assert timing.prefill_s(8192, 0) == pytest.approx(paper.prefill_s(8192, 0), rel=0.05)
    assert timing.prefill_s(8192, 0) != paper.prefill_s(8192, 0)


def test_noise_is_seeded_and_centered(paper: RooflineTiming) -> None:
    def draws(seed: int, std: float = 0.1) -> list[float]:
        noisy = NoisyTiming(paper, std, seed)
        return [noisy.prefill_s(8192, 0) for _ in range(4000)]

    assert draws(1) == draws(1)
    assert draws(1) != draws(2)
    assert statistics.fmean(draws(1)) == pytest.approx(paper.prefill_s(8192, 0), rel=0.01)
    assert statistics.stdev(draws(1)) / paper.prefill_s(8192, 0) == pytest.approx(0.1, rel=0.1)
    assert min(draws(3, std=0.9)) >= 0.05 * paper.prefill_s(8192, 0)
    assert draws(1, std=0.0) == [paper.prefill_s(8192, 0)] * 4000
    noisy = load_timing("paper", noise=0.2, seed=7)
    assert isinstance(noisy, NoisyTiming)
    assert noisy.decode_step_s(0, 0) == 0.0 and noisy.transfer_s(0) == 0.0
    assert noisy.kv_bytes_per_token == KV_BYTES and noisy.instance == paper.instance
    assert load_timing("paper", noise=0.0) == paper


def write(tmp_path: Path, content: str) -> str:
    path = tmp_path / "profile.json"
    path.write_text(content)
    return str(path)


def without(profile: dict[str, Any], section: str, key: str) -> dict[str, Any]:
    profile = json.loads(json.dumps(profile))
    del profile[section][key]
    return profile


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ("{}", "neither a 'roofline' section nor"),
        (json.dumps(without(measured_profile(), "link", "bandwidth_bytes_per_s")), "lacks"),
        (json.dumps(without(measured_profile(), "instance", "ssd_capacity_bytes")), "lacks"),
        (
            json.dumps({**measured_profile(), "kv_bytes_per_token": -1}),
            "'kv_bytes_per_token' must be positive",
        ),
        (
            json.dumps({**measured_profile(), "prefill_points": [{"input_tokens": 1}]}),
            "at least two points",
        ),
        (json.dumps({**measured_profile(), "format": "other/2"}), "has format 'other/2'"),
    ],
)
def test_load_errors_are_one_line(tmp_path: Path, content: str, message: str) -> None:
    path = write(tmp_path, content)
    with pytest.raises(ValueError, match=message) as error:
        load_timing(path)
    assert "\n" not in str(error.value) and path in str(error.value)


def test_load_errors_for_missing_files_and_bad_roofline_fields(tmp_path: Path) -> None:
    missing = r"neither a built-in \(paper, tiny-cpu, smollm2-cpu\) nor a file"
    with pytest.raises(ValueError, match=missing) as error:
        load_timing(str(tmp_path / "absent.json"))
    assert "\n" not in str(error.value)
    paper = json.loads(json.dumps(_paper_profile()))
    paper["roofline"]["hardware"]["prefill_mfu"] = 0
    with pytest.raises(ValueError, match=r"'roofline\.hardware\.prefill_mfu' must be positive"):
        load_timing(write(tmp_path, json.dumps(paper)))
    paper = json.loads(json.dumps(_paper_profile()))
    paper["kv_bytes_per_token"] = 1
    with pytest.raises(ValueError, match="disagrees with the model shape's 327680"):
        load_timing(write(tmp_path, json.dumps(paper)))
    paper = json.loads(json.dumps(_paper_profile()))
    del paper["roofline"]["model"]["num_layers"]
    with pytest.raises(ValueError, match=r"lacks 'roofline\.model\.num_layers'"):
        load_timing(write(tmp_path, json.dumps(paper)))


def _paper_profile() -> dict[str, Any]:
    path = profile_path("paper")
    return json.loads(path.read_text())


def test_policy_fit_is_close_but_not_the_truth(paper: RooflineTiming) -> None:
    belief = policy_cost_model(paper)
    errors = []
    for inputs in (1000, 2048, 6000, 12_000, 32_768, 100_000, 131_072):
        for fraction in (0.0, 0.3, 0.6, 0.9):
            cached = int(inputs * fraction) // 512 * 512
            truth_s = paper.prefill_s(inputs, cached)
            errors.append(abs(belief.prefill_time_s(inputs, cached) / truth_s - 1))
    for batch in (1, 8, 32, 64, 128):
        for per_request in (2000, 8000):
            truth_s = paper.decode_step_s(batch, batch * per_request)
            errors.append(abs(belief.decode_step_time_s(batch, batch * per_request) / truth_s - 1))
    assert max(errors) < 0.25
    assert max(errors) > 0.01  # the policy mispredicts: it is a fit, not the truth
    # Near a fully cached prompt the weight-read floor is missed by the fitted form.
    assert belief.prefill_time_s(512, 512) < 0.5 * paper.prefill_s(512, 512)
    assert belief.transfer_time_s(512) == pytest.approx(paper.transfer_s(512 * KV_BYTES))
    assert belief.kv_bytes_per_token == KV_BYTES
    assert policy_cost_model(NoisyTiming(paper, 0.3, seed=1)) == belief


def test_the_twin_believes_what_the_conductor_and_the_agents_believe_on_a_profile() -> None:
    """One function turns a profile into the policy's cost model (CostModel.from_profile):
    the Conductor's --profile, an agent's --profile and the twin's policy agree exactly."""
    import json

    from backend.cli.conductor_cmd import cost_model
    from backend.policy import CostModel
    from twin.timing import believed_from_profile

    conductor = cost_model("tiny-cpu")
    agent = CostModel.from_profile(json.loads(profile_path("tiny-cpu").read_text()))
    assert believed_from_profile("tiny-cpu", 16) == conductor == agent
