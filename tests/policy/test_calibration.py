"""Calibration on hand-made measurements: too few points, outliers, bounded change, restart."""

import json

import numpy as np
import pytest

from backend.policy.calibration import (
    CalibrationConfig,
    Calibrator,
    DecodeStepSample,
    PrefillSample,
    ServingSample,
)
from backend.policy.cost_model import CostModel, DecodeFit, LinkModel, PrefillFit

BASE = CostModel(
    prefill=PrefillFit(fixed_s=0.001, per_token_s=1e-5),
    decode=DecodeFit(fixed_s=0.002, per_request_s=1e-4, per_context_token_s=0.0),
    link=LinkModel(1e9),
    kv_bytes_per_token=2048,
)
# What the "cluster" really does: three times slower prefill, a costlier decode step.
TRUE_PREFILL = PrefillFit(fixed_s=0.004, per_token_s=3e-5)
TRUE_DECODE = DecodeFit(fixed_s=0.006, per_request_s=3e-4, per_context_token_s=1e-7)
FREE = CalibrationConfig(max_change_factor=1e6, refit_interval_s=0.0)


def measured(num: int, *, seed: int = 0, outliers: int = 0, t_s: float = 0.0):
    rng = np.random.default_rng(seed)
    prefill, decode = [], []
    for i in range(num):
        n = int(rng.integers(16, 2000))
        cached = int(rng.integers(0, n // 16)) * 16
        seconds = TRUE_PREFILL.time_s(n, cached) * rng.normal(1.0, 0.02)
        prefill.append(PrefillSample(t_s, n, cached, seconds * (20 if i < outliers else 1)))
        batch, context = int(rng.integers(1, 64)), int(rng.integers(10, 20_000))
        step_s = TRUE_DECODE.step_s(batch, context) * rng.normal(1.0, 0.02)
        decode.append(DecodeStepSample(t_s, batch, context, step_s * (20 if i < outliers else 1)))
    return prefill, decode


def test_too_few_points_keep_the_model_and_say_so() -> None:
    calibrator = Calibrator(BASE, FREE)
    prefill, decode = measured(5)
    calibrator.add_prefill(prefill)
    calibrator.add_decode(decode)
    refit = calibrator.refit(1.0)
    assert refit.cost == BASE and refit.updated == ()
    assert refit.notes == (
        "prefill: 5 point(s) in the window, 20 needed; the fit is kept",
        "decode: 5 point(s) in the window, 50 needed; the fit is kept",
        "serving: 0 point(s) in the window, 10 needed; the fit is kept",
    )


def test_it_converges_on_the_measured_times_despite_outliers() -> None:
    calibrator = Calibrator(BASE, FREE)
    prefill, decode = measured(400, outliers=20)
    calibrator.add_prefill(prefill)
    calibrator.add_decode(decode)
    refit = calibrator.refit(1.0)
    assert refit.updated == ("prefill", "decode")
    for n, cached in ((100, 0), (1000, 512), (2000, 0)):
        assert refit.cost.prefill.time_s(n, cached) == pytest.approx(
            TRUE_PREFILL.time_s(n, cached), rel=0.05
        )
    for batch, context in ((1, 100), (32, 10_000), (60, 19_000)):
        assert refit.cost.decode.step_s(batch, context) == pytest.approx(
            TRUE_DECODE.step_s(batch, context), rel=0.05
        )
    assert calibrator.residuals()["prefill_median_rel_err"] < 0.05
    assert refit.cost.name == "calibrated-unnamed"


def test_one_refit_moves_the_model_by_at_most_the_bounded_factor() -> None:
    calibrator = Calibrator(BASE, CalibrationConfig(max_change_factor=2.0, refit_interval_s=0))
    prefill, decode = measured(200)
    calibrator.add_prefill(prefill)
    calibrator.add_decode(decode)
    points = [(s.input_tokens, s.cached_tokens) for s in prefill]
    first = calibrator.refit(1.0).cost
    ratios = [first.prefill.time_s(*p) / BASE.prefill.time_s(*p) for p in points]
    assert float(np.median(ratios)) == pytest.approx(2.0, rel=0.05)  # truth is ~3x: capped
    second = calibrator.refit(2.0).cost  # the next refit goes the rest of the way
    assert second.prefill.time_s(1000, 0) == pytest.approx(TRUE_PREFILL.time_s(1000, 0), rel=0.05)


def test_serving_costs_are_medians_and_the_window_forgets_old_points() -> None:
    calibrator = Calibrator(BASE, CalibrationConfig(window_s=10.0, refit_interval_s=0))
    calibrator.add_serving(ServingSample(float(t), 0.01 * t, 0.002) for t in range(1, 12))
    calibrator.add_serving([ServingSample(0.0, 99.0, 99.0)])  # old: beyond the window at 12
    refit = calibrator.refit(12.0)
    assert "serving" in refit.updated
    assert refit.cost.serving.dispatch_s == pytest.approx(0.065)  # median of 0.02..0.11
    assert refit.cost.serving.first_token_s == pytest.approx(0.002)
    assert refit.cost.serving.ttft_overhead_s == pytest.approx(0.067)


def test_its_state_survives_a_restart_and_bad_state_changes_nothing() -> None:
    calibrator = Calibrator(BASE, FREE)
    prefill, decode = measured(100)
    calibrator.add_prefill(prefill)
    calibrator.add_decode(decode)
    calibrator.refit(1.0)
    restarted = Calibrator(BASE, FREE)
    restarted.restore(calibrator.to_state())
    assert restarted.cost == calibrator.cost and restarted.num_refits == 1
    assert list(restarted.prefill) == list(calibrator.prefill)
    with pytest.raises(ValueError, match="malformed"):
        restarted.restore({"cost": BASE.to_profile(), "prefill": [{"nope": 1}]})
    assert restarted.cost == calibrator.cost


def test_it_keeps_what_it_believed_when_over_its_window() -> None:
    calibrator = Calibrator(BASE, CalibrationConfig(window_s=10.0, refit_interval_s=0))
    prefill, decode = measured(100, t_s=1.0)
    calibrator.add_prefill(prefill)
    calibrator.add_decode(decode)
    first = calibrator.refit(1.0).cost
    assert calibrator.refit(2.0).cost != first  # the bounded refit goes on moving
    second = calibrator.cost
    assert calibrator.refit(3.0).cost == second  # converged: no new belief
    assert list(calibrator.beliefs) == [(1.0, first), (2.0, second)]
    # Past the window only the model in force as it began stays.
    calibrator.refit(20.0)
    assert list(calibrator.beliefs) == [(2.0, second)]
    restarted = Calibrator(BASE)
    restarted.restore(json.loads(json.dumps(calibrator.to_state())))
    assert list(restarted.beliefs) == [(2.0, second)]
    older = {k: v for k, v in calibrator.to_state().items() if k != "beliefs"}
    restarted.restore(older)  # a state saved before beliefs were kept
    assert not restarted.beliefs and restarted.cost == second


def test_a_snapshot_keeps_the_window_and_model_of_its_moment() -> None:
    calibrator = Calibrator(BASE, FREE)
    prefill, decode = measured(60)
    calibrator.add_prefill(prefill)
    calibrator.add_decode(decode)
    calibrator.refit(1.0)
    snapshot = calibrator.snapshot()
    calibrator.add_prefill(prefill)
    calibrator.refit(2.0)
    assert len(snapshot.prefill) == 60 and len(snapshot.decode) == len(decode)
    assert snapshot.num_refits == 1 and calibrator.num_refits == 2
    assert snapshot.config == calibrator.config and snapshot.base == BASE


def test_a_refit_with_too_few_points_does_not_delay_the_first_real_one() -> None:
    """A Conductor checks at its first heartbeat, before any request: that check must not
    put the first refit a whole interval later (at speed 8 a 7.5 s warm-up then ran on the
    idle profile throughout)."""
    calibrator = Calibrator(BASE, CalibrationConfig(refit_interval_s=10.0))
    assert calibrator.is_due(0.0)
    assert calibrator.refit(0.0).updated == () and calibrator.num_refits == 0
    assert calibrator.is_due(1.0)  # nothing was fitted: try again at the next check
    prefill, decode = measured(400)
    calibrator.add_prefill(prefill)
    calibrator.add_decode(decode)
    assert calibrator.refit(2.0).updated and calibrator.num_refits == 1
    assert not calibrator.is_due(11.0) and calibrator.is_due(12.0)


def test_a_part_kept_for_too_few_points_is_due_as_soon_as_it_has_them() -> None:
    """A refit of the serving path alone (its points come first, from the Conductor) must
    not keep prefill on the old model a whole interval: it is due once it has its points."""
    config = CalibrationConfig(refit_interval_s=10.0)
    calibrator = Calibrator(BASE, config)
    calibrator.add_serving(
        ServingSample(float(i), 0.02, 0.01) for i in range(config.min_serving_points)
    )
    assert calibrator.refit(1.0).updated == ("serving",)
    assert calibrator.waiting == ("prefill", "decode")
    assert not calibrator.is_due(2.0)  # prefill and decode still have too few points
    prefill, decode = measured(400)
    calibrator.add_prefill(prefill)
    assert calibrator.is_due(2.0)
    assert calibrator.refit(2.0).updated == ("prefill", "serving")
    assert calibrator.waiting == ("decode",) and not calibrator.is_due(3.0)
    calibrator.add_decode(decode)
    assert calibrator.is_due(3.0) and "decode" in calibrator.refit(3.0).updated
    assert calibrator.waiting == () and not calibrator.is_due(12.0) and calibrator.is_due(13.0)


def test_a_young_fit_is_refitted_as_its_points_double() -> None:
    """A first fit from the minimum of points is rough: it is refitted as soon as its points
    have doubled, not a whole interval later (at speed 8 the fit from a warm-up's first 20
    prefills was believed over the rest of it); the counts survive a restart."""
    config = CalibrationConfig(refit_interval_s=10.0, min_decode_points=3)
    calibrator = Calibrator(BASE, config)
    prefill, decode = measured(200)
    calibrator.add_prefill(prefill[:20])
    calibrator.add_decode(decode[:20])
    assert set(calibrator.refit(1.0).updated) == {"prefill", "decode"}
    assert calibrator.fitted_points == {"prefill": 20, "decode": 20}
    calibrator.add_prefill(prefill[20:39])
    assert not calibrator.is_due(2.0)  # 39 points: not yet doubled, the interval not over
    calibrator.add_prefill(prefill[39:40])
    assert calibrator.is_due(2.0)
    assert set(calibrator.refit(2.0).updated) == {"prefill", "decode"}
    assert calibrator.fitted_points == {"prefill": 40, "decode": 20}
    calibrator.add_prefill(prefill[40:79])
    calibrator.add_decode(decode[20:39])
    assert not calibrator.is_due(3.0)
    restarted = Calibrator(BASE, config)
    restarted.restore(json.loads(json.dumps(calibrator.to_state())))
    assert restarted.fitted_points == calibrator.fitted_points
    restarted.last_refit_s = calibrator.last_refit_s  # as the twin takes over live's
    assert not restarted.is_due(3.0)
    calibrator.add_decode(decode[39:40])  # decode's points doubled
    restarted.add_decode(decode[39:40])
    assert calibrator.is_due(3.0) and restarted.is_due(3.0)
    older = {k: v for k, v in calibrator.to_state().items() if k != "fitted_points"}
    restarted.restore(older)  # a state saved before the counts were kept: the interval rules
    restarted.last_refit_s = calibrator.last_refit_s
    assert restarted.fitted_points == {} and not restarted.is_due(3.0)
    for bad in ({"prompts": 3}, {"prefill": "many"}, ["prefill"]):
        with pytest.raises(ValueError, match="malformed"):
            restarted.restore({**older, "fitted_points": bad})
    with pytest.raises(ValueError, match="refit_growth"):
        CalibrationConfig(refit_growth=1.0)


def test_the_answer_s_way_back_is_its_own_term_of_the_ttft_overhead() -> None:
    """Samples that split the way to and from the prefill agent give each its median, and
    admission's TTFT overhead counts both; samples without the split (an agent that does not
    stamp its answer) hold both ways in `dispatch_s`, as before."""
    config = CalibrationConfig()
    calibrator = Calibrator(BASE, config)
    calibrator.add_serving(
        ServingSample(float(i), 0.02, 0.01, answer_s=0.015)
        for i in range(config.min_serving_points)
    )
    serving = calibrator.refit(1.0).cost.serving
    assert (serving.dispatch_s, serving.answer_s, serving.first_token_s) == (0.02, 0.015, 0.01)
    assert serving.ttft_overhead_s == pytest.approx(0.045)
    old = Calibrator(BASE, config)
    old.add_serving(ServingSample(float(i), 0.035, 0.01) for i in range(config.min_serving_points))
    serving = old.refit(1.0).cost.serving
    assert serving.answer_s == 0.0 and serving.ttft_overhead_s == pytest.approx(0.045)


def test_the_prefill_line_s_hand_over_is_the_mean_and_kept_until_enough_are_measured() -> None:
    """The line's hand-over is summed once per request ahead, so its mean is fitted (a late
    wake-up counts at its share); prefills that found the worker free measure none; with
    too few measured the believed value stays."""
    config = CalibrationConfig()
    enough = config.min_serving_points
    calibrator = Calibrator(BASE, config)
    calibrator.add_serving(ServingSample(float(i), 0.02, 0.01) for i in range(enough))
    prefill, _ = measured(config.min_prefill_points)
    calibrator.add_prefill(prefill)  # found the worker free: no hand-over
    calibrator.add_prefill(
        PrefillSample(1.0, 100, 0, 0.01, handover_s=h) for h in [0.001] * (enough - 2)
    )
    assert calibrator.refit(1.0).cost.serving.handover_s == 0.0  # too few: kept
    calibrator.add_prefill(PrefillSample(1.0, 100, 0, 0.01, handover_s=h) for h in (0.001, 0.021))
    serving = calibrator.refit(2.0).cost.serving
    assert serving.handover_s == pytest.approx((0.001 * (enough - 1) + 0.021) / enough)
    assert serving.ttft_overhead_s == pytest.approx(0.03)  # not a per-request overhead
