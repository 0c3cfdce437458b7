"""The what-if's pure parts, table-driven: the twin's model of the live cluster, a proposed
change and the role switches it takes, trace parsing with line numbers, the prediction kept
in the audit log and its comparison with what the cluster measured."""

import dataclasses
import json
import math

import pytest

from backend.policy.config import PolicyConfig
from console import prediction as predictions
from console.history import describe_change, describe_prediction
from console.whatif import (
    ProposedChange,
    TraceProblem,
    live_split,
    live_twin_config,
    policy_changes,
    proposed_config,
    role_switches,
    rows_from_jsonl,
    series_interval_s,
)
from twin.compare import compare_reports

POLICY = {
    **dataclasses.asdict(PolicyConfig()),
    "block_size": 64,
    "kvcache_balancing_threshold": 3.0,
    "ttft_slo_s": 12.0,
    "tbt_slo_s": 0.05,
}


def _agent(instance_id: str, role: str, state: str = "active", **load: int) -> dict:
    return {"instance_id": instance_id, "role": role, "state": state, "load": load}


AGENTS = [
    _agent("p0", "prefill", num_queued=3),
    _agent("p1", "prefill"),
    _agent("p2", "prefill", state="draining"),
    _agent("d0", "decode", batch_size=5),
    _agent("d1", "decode", batch_size=1),
]


def test_the_twin_models_the_live_split_policy_and_slos():
    config = live_twin_config(POLICY, AGENTS, profile="tiny.json")
    assert (config.num_prefill, config.num_decode) == (2, 2)  # p2 is draining away
    assert (config.threshold, config.ttft_slo_s, config.tbt_slo_s) == (3.0, 12.0, 0.05)
    assert (config.scheduler, config.rejection) == ("kvcache-centric", "early-predicted")
    assert config.profile == "tiny.json"
    assert config.block_size == 64  # the Conductor's: recorded windows export at it


def test_an_infinite_threshold_comes_as_inf():
    config = live_twin_config(
        {**POLICY, "kvcache_balancing_threshold": "inf"}, AGENTS, profile="paper"
    )
    assert config.threshold == math.inf


def test_a_cluster_without_decode_cannot_be_modelled():
    with pytest.raises(ValueError, match="1 prefill and 0 decode agents"):
        live_twin_config(POLICY, [_agent("p0", "prefill")], profile="paper")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (ProposedChange(), {}),
        (ProposedChange(threshold=1.0), {"kvcache_balancing_threshold": 1.0}),
        (ProposedChange(threshold=math.inf), {"kvcache_balancing_threshold": math.inf}),
        (ProposedChange(scheduler="cache-aware"), {"prefill_scheduler": "cache-aware"}),
        (ProposedChange(rejection="early", decode_time_s=8.0),
         {"rejection_policy": "early", "decode_time_s": 8.0}),
        (ProposedChange(num_prefill=3), {}),  # a split is not a policy setting
    ],
)  # fmt: skip
def test_policy_changes_name_the_live_settings(change, expected):
    current = live_twin_config(POLICY, AGENTS, profile="paper")
    assert policy_changes(current, proposed_config(current, change)) == expected


def test_a_new_split_keeps_the_total_and_needs_both_pools():
    current = live_twin_config(POLICY, AGENTS, profile="paper")
    candidate = proposed_config(current, ProposedChange(num_prefill=3))
    assert (candidate.num_prefill, candidate.num_decode) == (3, 1)
    with pytest.raises(ValueError, match="4 prefill agents of 4 leaves no decode agent"):
        proposed_config(current, ProposedChange(num_prefill=4))


@pytest.mark.parametrize(
    ("num_prefill", "moves"),
    [
        (2, []),
        (3, [("d1", "prefill")]),  # the less busy decode agent
        (1, [("p1", "decode")]),  # the less busy prefill agent; p2 is already draining
    ],
)
def test_role_switches_move_the_least_busy_agents(num_prefill, moves):
    assert role_switches(AGENTS, num_prefill) == moves


def test_a_bad_trace_line_is_named_with_its_source():
    good = json.dumps({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]})
    back = json.dumps({"timestamp": -5, "input_length": 10, "output_length": 1, "hash_ids": [0]})
    with pytest.raises(TraceProblem, match=r"^up\.jsonl, line 3: ") as raised:
        rows_from_jsonl(f"{good}\n\n{back}\n".encode(), "up.jsonl")
    assert raised.value.line_number == 3
    assert rows_from_jsonl(f"{good}\n".encode(), "ok")[0].input_length == 10


def test_series_get_about_sixty_windows():
    rows = rows_from_jsonl(
        "".join(
            json.dumps({"timestamp": t, "input_length": 9, "output_length": 1, "hash_ids": [0]})
            + "\n"
            for t in (0, 600_000)
        ).encode(),
        "two",
    )
    assert series_interval_s(rows) == 10.0
    assert series_interval_s(rows[:1]) == 1.0


def _report(num_prefill: int, ttft_p90_s: float, threshold: float) -> dict:
    metrics = {name: 1.0 for name in predictions.METRICS}
    return {
        **metrics,
        "ttft_p90_s": ttft_p90_s,
        "rejected_by_reason": {"admission:ttft_slo": 2},
        "config": {"num_prefill": num_prefill, "num_decode": 1, "threshold": threshold},
        "trace": {"label": "t"},
        "series": {"t_s": [0.0]},
        "requests": [{"id": "r1"}] * 1000,
    }


def test_a_prediction_is_compact_json_with_deltas_and_both_runs():
    result = compare_reports(_report(2, 4.0, 2.0), _report(1, 3.0, math.inf))
    summary = predictions.summarize(
        result,
        config_change={"kvcache_balancing_threshold": math.inf},
        role_switches=[("p1", "decode")],
        trace={"source": "upload", "num_rows": 7},
        made_at_s=1.5,
    )
    text = json.dumps(summary, allow_nan=False)  # strict JSON: inf travels as "inf"
    assert '"requests"' not in text and '"series"' not in text
    assert summary["config_change"] == {"kvcache_balancing_threshold": "inf"}
    assert summary["split"] == {"baseline": "2:1", "candidate": "1:1"}
    assert summary["role_switches"] == [{"instance_id": "p1", "role": "decode"}]
    assert summary["candidate"]["ttft_p90_s"] == 3.0
    assert summary["candidate"]["rejected_by_reason"] == {"admission:ttft_slo": 2}
    ttft = next(row for row in summary["deltas"] if row["metric"] == "ttft_p90_s")
    assert (ttft["delta"], ttft["verdict"]) == (-1.0, "better")
    assert describe_prediction(summary).startswith("ttft_p90_s 4.00 s -> 3.00 s; ")


def test_predicted_vs_actual_goes_key_by_key():
    prediction = {"candidate": {"ttft_p90_s": 2.0, "num_requests": 10, "goodput_rps": None}}
    actual = {"ttft_p90_s": 2.5, "num_requests": 4, "goodput_rps": 0.5, "other": 1}
    rows = {row["metric"]: row for row in predictions.predicted_vs_actual(prediction, actual)}
    assert set(rows) == {"ttft_p90_s", "num_requests", "goodput_rps"}
    assert (rows["ttft_p90_s"]["difference"], rows["ttft_p90_s"]["relative"]) == (0.5, 0.25)
    assert rows["num_requests"]["scales_with_traffic"]
    assert not rows["ttft_p90_s"]["scales_with_traffic"]
    assert rows["goodput_rps"]["difference"] is None


@pytest.mark.parametrize(
    ("old", "new", "text"),
    [
        ({"a": 1, "b": 2.5}, {"a": 1, "b": 4.0}, "b: 2.5 -> 4"),
        ({"a": 1}, {"a": 1}, "no setting changed"),
        (None, {"b": 1, "a": "x"}, "initial: a=x, b=1"),
        ({"instance_id": "p0", "role": "prefill"}, {"instance_id": "p0", "role": "decode"},
         "p0: prefill -> decode"),
    ],
)  # fmt: skip
def test_an_audit_entry_says_what_changed(old, new, text):
    assert describe_change(old, new) == text


def test_live_split_counts_active_agents_only():
    assert live_split(AGENTS) == (2, 2)


def test_the_twin_believes_what_live_believed_over_a_recorded_window(shipped_trace):
    """A recorded window's twin believes each model live's Conductor believed, from when it
    did, in the current configuration's run and a candidate's on the same split; a
    candidate on another split calibrates on its own. Here live believed prefills hopeless
    (5,000 s) until its refit 3 s into the window: the twin refuses until then."""
    from backend.policy.calibration import Calibrator
    from backend.policy.cost_model import CostModel
    from backend.traces.loader import load_trace
    from console.whatif import live_beliefs, run_whatif
    from twin.config import TwinConfig
    from twin.timing import read_profile

    data, _ = read_profile("tiny-cpu")
    truth = CostModel.from_profile(data)
    hopeless = dataclasses.replace(
        truth, prefill=dataclasses.replace(truth.prefill, fixed_s=5000.0), name="hopeless"
    )
    rows = load_trace(shipped_trace, minutes=(0.0, 0.15))  # nine seconds
    start_s = 1_000_000.0  # the export's start: rows are timed from it
    zero_s = start_s + rows[0].timestamp_ms / 1000.0
    state = json.loads(json.dumps(Calibrator(truth).to_state()))
    calibration = {
        "enabled": True,
        "last_refit_s": zero_s + 3.0,
        "profile_inputs": {
            "base": hopeless.to_profile(),
            "config": {"refit_interval_s": 3600.0},
            "window": {**state, "num_refits": 1, "beliefs": [
                {"time_s": zero_s + 3.0, "cost": truth.to_profile()}
            ]},
        },
    }  # fmt: skip
    beliefs = live_beliefs(calibration, rows, window_start_s=start_s)
    assert beliefs is not None
    assert beliefs.beliefs == [(-math.inf, hopeless), (3.0, truth)]
    span_s = (rows[-1].timestamp_ms - rows[0].timestamp_ms) / 1000.0
    assert beliefs.from_s == span_s and beliefs.config.refit_interval_s == 3600.0
    assert live_beliefs({**calibration, "enabled": False}, rows, window_start_s=start_s) is None
    assert live_beliefs({"enabled": True}, rows, window_start_s=start_s) is None

    current = TwinConfig.of_live_policy(
        {**POLICY, "block_size": 16, "ttft_slo_s": 1000.0, "tbt_slo_s": 10.0},
        num_prefill=1,
        num_decode=1,
        profile="tiny-cpu",
    )
    arrivals_s = [(row.timestamp_ms - rows[0].timestamp_ms) / 1000.0 for row in rows]

    def refused(report) -> list[float]:
        return [r["arrival_s"] for r in report["requests"] if r["outcome"] == "rejected"]

    same_split = run_whatif(current, current.with_changes(threshold=1.0), rows, beliefs=beliefs)
    for report in same_split["reports"].values():
        assert refused(report) == [t for t in arrivals_s if t < 3.0] and refused(report)
    other_split = current.with_changes(num_prefill=2, num_decode=1)
    result = run_whatif(current, other_split, rows, beliefs=beliefs, workers=1)
    assert refused(result["reports"]["candidate"]) == []  # its own calibration: tiny-cpu's
