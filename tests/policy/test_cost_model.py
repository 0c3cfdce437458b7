"""The cost model: its forms, the least-squares fit from profile points, profile JSON."""

import json

import pytest

from backend.policy import CostModel, DecodeFit, LinkModel, PrefillFit
from backend.policy.cost_model import fit_decode, fit_prefill


def test_forms() -> None:
    model = CostModel(
        prefill=PrefillFit(fixed_s=0.1, per_token_s=1e-3, per_token_pair_s=1e-6),
        decode=DecodeFit(fixed_s=0.02, per_request_s=1e-3, per_context_token_s=1e-6),
        link=LinkModel(bandwidth_bytes_per_s=1e9, latency_s=0.01),
        kv_bytes_per_token=1000,
    )
    # 100 new tokens after 50 cached: 0.1 + 0.1 + 1e-6 * 100 * 200 / 2
    assert model.prefill_time_s(150, 50) == pytest.approx(0.21)
    assert model.prefill_time_s(150, 150) == pytest.approx(0.1 + 1e-3 + 1e-6 * 150)  # 1 token
    assert model.decode_step_time_s(4, 1000) == pytest.approx(0.02 + 0.004 + 0.001)
    assert model.decode_step_time_s(0, 0) == 0.0
    assert model.transfer_time_s(1000, backlog_s=0.5) == pytest.approx(0.01 + 0.001 + 0.5)
    assert model.transfer_time_s(0) == 0.0


def test_fit_recovers_the_coefficients_of_exact_points() -> None:
    truth = PrefillFit(fixed_s=0.05, per_token_s=2e-4, per_token_pair_s=3e-9)
    points = [(i, c, truth.time_s(i, c)) for i in (512, 2048, 8192, 32768) for c in (0, i // 2)]
    fitted = fit_prefill(points)
    assert fitted.fixed_s == pytest.approx(0.05, rel=1e-6)
    assert fitted.per_token_s == pytest.approx(2e-4, rel=1e-6)
    assert fitted.per_token_pair_s == pytest.approx(3e-9, rel=1e-6)

    decode_truth = DecodeFit(fixed_s=0.03, per_request_s=5e-4, per_context_token_s=2e-8)
    decode_points = [
        (b, ctx, decode_truth.step_s(b, ctx)) for b in (1, 8, 32) for ctx in (1000, 100_000)
    ]
    assert fit_decode(decode_points) == pytest.approx(decode_truth) or (
        fit_decode(decode_points).per_request_s == pytest.approx(5e-4, rel=1e-6)
    )


def test_fit_never_returns_negative_coefficients() -> None:
    # Purely linear timings with noise that would pull the quadratic term below zero.
    points = [(n, 0, 0.001 * n - 1e-10 * n * n) for n in (100, 1000, 5000, 20000, 40000)]
    fitted = fit_prefill(points)
    assert min(fitted.fixed_s, fitted.per_token_s, fitted.per_token_pair_s) >= 0.0
    assert fitted.per_token_pair_s == 0.0


def test_profile_round_trip_through_json_and_fit_from_points() -> None:
    model = CostModel.reference_70b()
    assert CostModel.from_profile(json.loads(json.dumps(model.to_profile()))) == model

    truth = PrefillFit(fixed_s=0.01, per_token_s=1e-4, per_token_pair_s=0.0)
    profile = {
        "kv_bytes_per_token": 4096,
        "link": {"bandwidth_bytes_per_s": 1e9, "latency_s": 1e-4},
        "prefill_points": [
            {"input_tokens": n, "cached_tokens": c, "seconds": truth.time_s(n, c)}
            for n in (64, 256, 1024)
            for c in (0, 32)
        ],
        "decode_points": [
            {"batch_size": b, "context_tokens": ctx, "seconds": 0.01 + 0.001 * b}
            for b in (1, 2, 4)
            for ctx in (100, 1000)
        ],
    }
    fitted = CostModel.from_profile(profile)
    assert fitted.prefill_time_s(2048, 0) == pytest.approx(truth.time_s(2048, 0), rel=1e-6)
    assert fitted.decode_step_time_s(8, 500) == pytest.approx(0.018, rel=1e-6)


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        ({}, "profile lacks"),
        (
            {"kv_bytes_per_token": 1, "link": {"bandwidth": 1}, "prefill": {}, "decode": {}},
            "malformed",
        ),
    ],
)
def test_bad_profiles_are_clear_errors(profile, message) -> None:
    with pytest.raises(ValueError, match=message):
        CostModel.from_profile(profile)


def test_negative_coefficients_are_refused() -> None:
    with pytest.raises(ValueError, match=r"prefill\.per_token_s"):
        CostModel(
            prefill=PrefillFit(0.0, -1.0),
            decode=DecodeFit(0.0, 0.0, 0.0),
            link=LinkModel(1.0),
            kv_bytes_per_token=1,
        )
