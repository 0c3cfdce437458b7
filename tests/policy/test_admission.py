"""Admission policies: the pure decision, and the decode-drain cases through the core."""

import pytest

from backend.policy import (
    AgentJoined,
    ConductorCore,
    DecodeStarted,
    DispatchPrefill,
    PolicyConfig,
    PrefillFinished,
    PrefillStarted,
    Reject,
    RequestArrived,
)
from backend.policy.admission import LoadSnapshot, admit
from backend.policy.cost_model import DecodeFit

from .helpers import linear_cost, make_core


def snapshot(ttft_s=1.0, current=0.5, predicted=0.5) -> LoadSnapshot:
    return LoadSnapshot(
        estimated_ttft_s=ttft_s,
        ttft_slo_s=10.0,
        current_decode_load=current,
        predicted_decode_load=predicted,
        decode_time_s=20.0,
    )


@pytest.mark.parametrize(
    ("policy", "loads", "expected_reason"),
    [
        ("none", snapshot(ttft_s=99.0, current=9.0, predicted=9.0), None),
        ("baseline", snapshot(), None),
        ("baseline", snapshot(ttft_s=10.5), "ttft_slo"),
        ("baseline", snapshot(current=3.0, predicted=3.0), None),  # decode is checked later
        ("early", snapshot(current=1.2, predicted=0.4), "tbt_slo"),
        ("early", snapshot(current=0.9, predicted=1.4), None),
        ("early", snapshot(ttft_s=11.0), "ttft_slo"),
        ("early-predicted", snapshot(current=1.2, predicted=0.4), None),
        ("early-predicted", snapshot(current=0.9, predicted=1.4), "tbt_slo"),
        ("early-predicted", snapshot(ttft_s=10.0, current=1.0, predicted=1.0), None),  # at the SLO
    ],
)
def test_admit(policy, loads, expected_reason) -> None:
    rejection = admit(policy, loads)
    if expected_reason is None:
        assert rejection is None
    else:
        assert rejection is not None
        assert (rejection.reason, rejection.stage) == (expected_reason, "admission")
        assert rejection.retry_after_s >= 1.0 and rejection.message


# Decode step: 0.01 s per request in the batch; TBT SLO 0.1 s, so 10 requests fill a decode
# instance (ratio 1.0) and the 11th overloads it.
DECODE = DecodeFit(fixed_s=0.0, per_request_s=0.01, per_context_token_s=0.0)


def config(policy: str, *, learn: bool = False) -> PolicyConfig:
    """The paper's form by default: every request decodes for the uniform t_d of 20 s."""
    return PolicyConfig(
        block_size=16,
        rejection_policy=policy,
        ttft_slo_s=100.0,
        tbt_slo_s=0.1,
        decode_time_s=20.0,
        learn_decode_time=learn,
    )


def run_to_decode(core, request_id: str, now_s: float) -> None:
    (dispatch,) = core.handle(RequestArrived(now_s, request_id, (), 100, 10))
    core.handle(PrefillStarted(now_s, request_id, dispatch.instance_id))
    (decode,) = core.handle(PrefillFinished(now_s, request_id, dispatch.instance_id))
    core.handle(DecodeStarted(now_s, request_id, decode.instance_id))


def probe(policy: str, setup) -> tuple:
    core = make_core(config("none"), linear_cost(decode=DECODE))
    setup(core)
    core.reconfigure(config(policy))
    return core.handle(RequestArrived(100.0, "probe", (), 100, 10))


def ten_decoding_since_t0(core) -> None:
    for n in range(10):
        run_to_decode(core, f"old{n}", 0.0)


def twenty_in_prefill(core) -> None:
    for n in range(20):
        core.handle(RequestArrived(99.0, f"queued{n}", (), 100, 10))


def test_early_rejects_but_predicted_accepts_when_decode_will_have_drained() -> None:
    # Ten requests decoding since t=0 fill D1 now, but with t_d = 20 s they will be done
    # long before the probe's prefill ends at t > 100 s.
    (early,) = probe("early", ten_decoding_since_t0)
    assert isinstance(early, Reject) and (early.reason, early.stage) == ("tbt_slo", "admission")
    (predicted,) = probe("early-predicted", ten_decoding_since_t0)
    assert isinstance(predicted, DispatchPrefill)


def test_early_accepts_but_predicted_rejects_when_prefill_will_flood_decode() -> None:
    # Decode is idle now, but twenty requests ahead in prefill will reach it first.
    (early,) = probe("early", twenty_in_prefill)
    assert isinstance(early, DispatchPrefill)
    (predicted,) = probe("early-predicted", twenty_in_prefill)
    assert isinstance(predicted, Reject) and predicted.reason == "tbt_slo"


def test_baseline_ignores_decode_load_and_none_ignores_everything() -> None:
    (baseline,) = probe("baseline", ten_decoding_since_t0)
    assert isinstance(baseline, DispatchPrefill)
    core = make_core(config("none"), linear_cost(decode=DECODE))
    core.reconfigure(PolicyConfig(block_size=16, rejection_policy="none", ttft_slo_s=0.001))
    (accepted,) = core.handle(RequestArrived(0.0, "huge", (), 1_000_000, 10))
    assert isinstance(accepted, DispatchPrefill)


def test_per_request_ttft_slo_overrides_the_configured_one() -> None:
    core = make_core(config("baseline"), linear_cost(decode=DECODE))
    # 10,000 tokens at 2,000 tokens/s: 5 s of prefill.
    (tight,) = core.handle(RequestArrived(0.0, "tight", (), 10_000, 1, ttft_slo_s=4.0))
    assert isinstance(tight, Reject) and tight.reason == "ttft_slo"
    (loose,) = core.handle(RequestArrived(0.0, "loose", (), 10_000, 1, ttft_slo_s=6.0))
    assert isinstance(loose, DispatchPrefill)


def test_learned_decode_time_follows_completions() -> None:
    from backend.policy import DecodeFinished

    core = make_core(config("none"), linear_cost(decode=DECODE))
    core.reconfigure(
        PolicyConfig(block_size=16, rejection_policy="early-predicted", learn_decode_time=True)
    )
    assert core.decode_time_s == 20.0  # nothing learned yet: the configured t_d
    for n, duration_s in enumerate((4.0, 6.0)):
        run_to_decode(core, f"r{n}", 0.0)
        core.handle(DecodeFinished(duration_s, f"r{n}"))
    assert core.decode_time_s == pytest.approx(5.0)


def test_no_instance_rejects_with_a_clear_reason() -> None:
    core = make_core(config("none"), linear_cost(), prefill=(), decode=("D1",))
    (rejected,) = core.handle(RequestArrived(0.0, "r", (), 10, 1))
    assert isinstance(rejected, Reject)
    assert rejected.reason == "no_prefill_instance" and "prefill" in rejected.message


def test_predicted_keeps_requests_that_will_still_be_decoding() -> None:
    # Ten requests started at t=95: with t_d = 20 s they still decode when the probe's
    # prefill ends just after t=100, so the prediction sees a full instance too.
    def ten_recent(core) -> None:
        for n in range(10):
            run_to_decode(core, f"recent{n}", 95.0)

    (predicted,) = probe("early-predicted", ten_recent)
    assert isinstance(predicted, Reject) and predicted.reason == "tbt_slo"


def test_a_decode_instance_with_full_kv_memory_counts_as_loaded() -> None:
    # TBT stays far under the SLO, but D1's 1,000 tokens of KV memory are taken.
    from backend.policy import AgentJoined

    core = make_core(config("none"), linear_cost(decode=DECODE), decode=())
    core.handle(AgentJoined(0.0, "D1", "decode", kv_capacity_tokens=1000))
    for n in range(9):
        run_to_decode(core, f"r{n}", 99.0)
    assert core.decode_loads()["D1"] == pytest.approx(0.9)  # 9 x 100 tokens of 1,000
    for policy in ("early", "early-predicted"):
        core.reconfigure(config(policy))
        (verdict,) = core.handle(RequestArrived(100.0, f"probe-{policy}", (), 200, 10))
        assert isinstance(verdict, Reject) and "KV memory" in verdict.message


# -- the learned forecast (the default) -----------------------------------------------------
def finish_one(core, request_id: str, start_s: float, seconds: float, generated: int) -> None:
    from backend.policy import DecodeFinished

    run_to_decode(core, request_id, start_s)  # asks for 10 tokens
    core.handle(DecodeFinished(start_s + seconds, request_id, generated))


def test_learned_forecasts_converge_to_the_median_pace_and_share_of_completions() -> None:
    core = make_core(config("early-predicted", learn=True), linear_cost(decode=DECODE))
    assert core.decode_forecast.seconds_per_token is None  # nothing learned: the step stands in
    # Five requests asked for 10 tokens, generated 5 at 0.2 s each; one stalled stream.
    for n in range(5):
        finish_one(core, f"r{n}", 0.0, 1.0, 5)
    finish_one(core, "stalled", 0.0, 60.0, 5)
    forecast = core.decode_forecast
    assert forecast.seconds_per_token == pytest.approx(0.2) and forecast.output_share == 0.5
    assert forecast.decode_s(10, step_s=99.0) == pytest.approx(1.0)  # 5 tokens x 0.2 s


def test_requests_forecast_to_finish_before_the_prefill_ends_leave_the_prediction() -> None:
    """Ten requests of 10 tokens at 0.2 s/token started at t=95 end at t=97: the paper's
    t_d of 20 s keeps them in the pool at t=100 and rejects; the learned forecast does not."""

    def learned_then_ten_at_95(core) -> None:
        for n in range(5):
            finish_one(core, f"learned{n}", 0.0, 2.0, 10)  # 0.2 s per token, all 10 tokens
        for n in range(10):
            run_to_decode(core, f"recent{n}", 95.0)

    for learn, expected in ((False, Reject), (True, DispatchPrefill)):
        # Forecasts are booked with each request, under the configuration then in force.
        core = make_core(config("none", learn=learn), linear_cost(decode=DECODE))
        learned_then_ten_at_95(core)
        core.reconfigure(config("early-predicted", learn=learn))
        (verdict,) = core.handle(RequestArrived(100.0, "probe", (), 100, 10))
        assert isinstance(verdict, expected), (learn, verdict)


def test_requests_still_decoding_at_the_prefills_end_stay_in_the_prediction() -> None:
    def learned_then_ten_at_99(core) -> None:
        for n in range(5):
            finish_one(core, f"learned{n}", 0.0, 2.0, 10)
        for n in range(10):
            run_to_decode(core, f"recent{n}", 99.5)  # end at t=101.5, after the probe's prefill

    core = make_core(config("none", learn=True), linear_cost(decode=DECODE))
    learned_then_ten_at_99(core)
    core.reconfigure(config("early-predicted", learn=True))
    (verdict,) = core.handle(RequestArrived(100.0, "probe", (), 100, 10))
    assert isinstance(verdict, Reject) and verdict.reason == "tbt_slo"


def test_each_admitted_forecast_is_settled_against_the_pool_when_its_moment_comes() -> None:
    from backend.policy import Tick

    core = make_core(config("none"), linear_cost(decode=DECODE))
    for n in range(3):
        run_to_decode(core, f"busy{n}", 0.0)  # booked with the uniform 20 s: still decoding
    core.reconfigure(config("early-predicted", learn=True))
    (dispatch,) = core.handle(RequestArrived(1.0, "probe", (), 100, 10))
    assert isinstance(dispatch, DispatchPrefill)
    assert core.forecasts.summary()["num_decode_forecasts"] == 0  # not due yet
    core.handle(Tick(1.0 + dispatch.estimated_ttft_s + 0.01))
    (record,) = core.forecasts.records
    # Predicted: the three busy ones and the probe (0.4); realized: the three (0.3).
    assert record.predicted == pytest.approx(0.4) and record.realized == pytest.approx(0.3)
    summary = core.forecasts.summary()
    assert summary["decode_forecast_mae"] == pytest.approx(0.1)
    assert summary["decode_forecast_bias"] == pytest.approx(0.1)


def test_the_predicted_load_limit_moves_where_early_predicted_refuses() -> None:
    from dataclasses import replace

    loads = snapshot(current=0.5, predicted=0.95)
    assert admit("early-predicted", loads) is None
    tight = admit("early-predicted", replace(loads, predicted_load_limit=0.9))
    assert tight is not None and "over 90%" in tight.message  # headroom for forecast error
    trusting = replace(loads, predicted_decode_load=1.05, predicted_load_limit=1.1)
    assert admit("early-predicted", trusting) is None
    assert admit("early", replace(snapshot(current=1.05), predicted_load_limit=1.1))  # only e-p
    with pytest.raises(ValueError, match="predicted_load_limit"):
        PolicyConfig(predicted_load_limit=0.0)


def test_the_forecast_counts_kv_at_each_requests_pace_without_counting_tokens_twice() -> None:
    from backend.policy.cluster import DecodeState
    from backend.policy.decode_load import predicted_mean_ratio

    kv_only = linear_cost(decode=DecodeFit(fixed_s=0.0, per_request_s=0.0, per_context_token_s=0.0))
    state = DecodeState("D1", kv_capacity_tokens=1000)
    # Decoding since t=0, 100 prompt tokens, forecast 100 tokens over 10 s; live has already
    # reported 20 generated tokens (its context grew to 120).
    state.add_incoming("a", 100, 0.0, expected_s=10.0, expected_tokens=100)
    state.start("a", 100, 0.0)
    state.grow("a", 120)
    # In prefill, ready at t=4, forecast 50 tokens over 2 s: done by t=6.
    state.add_incoming("b", 200, 4.0, expected_s=2.0, expected_tokens=50)
    at_5 = predicted_mean_ratio(
        kv_only, [state], chosen_instance_id="none", context_tokens=0, at_s=5.0, tbt_slo_s=1.0
    )
    # a: 100 + 100 x 0.5 = 150 (not 120 + 50); b: 200 + 50 x 0.5 = 225.
    assert at_5 == pytest.approx((150 + 225) / 1000)
    assert state.decoding["a"].context_at(5.0) == 150 and state.incoming["b"].context_at(5.0) == 225
    at_7 = predicted_mean_ratio(
        kv_only, [state], chosen_instance_id="none", context_tokens=0, at_s=7.0, tbt_slo_s=1.0
    )
    assert at_7 == pytest.approx(170 / 1000)  # b has finished; a is at 100 + 70


def test_near_the_limit_the_size_weight_refuses_large_requests_and_keeps_small_ones() -> None:
    from dataclasses import replace

    # The pool will be at 0.97 of its memory with the request in it; the limit is 1.0.
    near = replace(snapshot(predicted=0.97), predicted_load_limit=1.0, predicted_size_weight=10.0)
    small = replace(near, own_decode_share=0.001)  # 0.97 + 9 x 0.001 = 0.979: admitted
    large = replace(near, own_decode_share=0.02)  # 0.97 + 9 x 0.02 = 1.15: refused
    assert admit("early-predicted", small) is None
    refused = admit("early-predicted", large)
    assert refused is not None and refused.reason == "tbt_slo" and refused.stage == "admission"
    assert "weighted by its size" in refused.message
    # Weight 1 is the plain forecast: both fit; `early` never looks at it.
    assert admit("early-predicted", replace(large, predicted_size_weight=1.0)) is None
    assert admit("early", replace(large, current_decode_load=0.5)) is None
    with pytest.raises(ValueError, match="predicted_size_weight"):
        PolicyConfig(predicted_size_weight=0.5)


def test_the_core_weights_the_request_by_its_share_of_the_decode_pool() -> None:
    from dataclasses import replace

    cost = linear_cost()
    config = PolicyConfig(block_size=16, rejection_policy="none", ttft_slo_s=1e6)
    core = ConductorCore(config, cost)
    core.handle(AgentJoined(0.0, "P", "prefill"))
    core.handle(AgentJoined(0.0, "D", "decode", 10_000))
    # 9,000 tokens decoding for long: the pool is at 0.9 of its memory.
    core.handle(RequestArrived(0.0, "big", (), 9_000, 10_000))
    core.handle(PrefillStarted(0.0, "big", "P"))
    core.handle(PrefillFinished(0.1, "big", "P"))
    core.handle(DecodeStarted(0.2, "big", "D"))
    core.reconfigure(replace(config, rejection_policy="early-predicted"))  # default weight
    # 0.9 + 0.005 + 9 x 0.005 = 0.95 fits under 1.05; 0.9 + 0.02 + 9 x 0.02 = 1.1 does not.
    (small,) = core.handle(RequestArrived(1.0, "small", (), 50, 1))
    (large,) = core.handle(RequestArrived(1.0, "large", (), 200, 1))
    assert isinstance(small, DispatchPrefill)
    assert isinstance(large, Reject) and large.reason == "tbt_slo"
