"""twin.compare: delta directions and verdicts, its files, a real what-if on the same arrivals."""

import json

import pytest

from backend.traces.loader import load_trace
from tests.twin.report_helpers import fake_report, parse_page
from twin.compare import (
    HIGHER_IS_BETTER,
    LOWER_IS_BETTER,
    NEUTRAL,
    compare,
    compare_reports,
    metric_deltas,
    write_compare,
)
from twin.config import TwinConfig


def deltas_by_metric(baseline: dict, candidate: dict) -> dict[str, dict]:
    return {row["metric"]: row for row in metric_deltas(baseline, candidate)}


@pytest.mark.parametrize(
    ("metric", "before", "after", "verdict"),
    [
        ("ttft_p90_s", 10.0, 5.0, "better"),
        ("ttft_mean_s", 1.0, 2.0, "worse"),
        ("tbt_p99_s", 0.05, 0.08, "worse"),
        ("num_rejected", 30, 20, "better"),
        ("wasted_prefill_s", 0.0, 4.0, "worse"),
        ("decode_load_amplitude", 0.6, 0.2, "better"),
        ("goodput_rps", 1.0, 2.0, "better"),
        ("slo_attainment", 0.9, 0.8, "worse"),
        ("cache_hit_ratio", 0.3, 0.4, "better"),
        ("num_completed", 7, 7, "same"),
        ("num_transferred_tokens", 100, 900, None),  # neutral: neither way is better
        ("prefill_load_period_s", 20.0, None, None),  # undefined in one run
    ],
)
def test_each_metric_is_judged_along_its_direction(metric, before, after, verdict):
    rows = deltas_by_metric(fake_report(**{metric: before}), fake_report(**{metric: after}))

    assert rows[metric]["verdict"] == verdict


def test_delta_and_relative_change():
    rows = deltas_by_metric(
        fake_report(ttft_p90_s=8.0, num_rejected_decode=0),
        fake_report(ttft_p90_s=6.0, num_rejected_decode=3),
    )

    assert rows["ttft_p90_s"] == {
        "metric": "ttft_p90_s",
        "baseline": 8.0,
        "candidate": 6.0,
        "delta": -2.0,
        "relative": -0.25,
        "better": "lower",
        "verdict": "better",
    }
    assert rows["num_rejected_decode"]["delta"] == 3
    assert rows["num_rejected_decode"]["relative"] is None  # no relative change from 0


def test_every_metric_appears_once_with_one_direction():
    metrics = [row["metric"] for row in metric_deltas(fake_report(), fake_report())]

    assert sorted(metrics) == sorted({*LOWER_IS_BETTER, *HIGHER_IS_BETTER, *NEUTRAL})
    assert not set(LOWER_IS_BETTER) & set(HIGHER_IS_BETTER)


def test_changed_settings_name_only_what_differs():
    result = compare_reports(
        fake_report(TwinConfig()), fake_report(TwinConfig(threshold=float("inf"), speed=2.0))
    )

    assert result["changed_settings"] == {
        "threshold": {"baseline": 2.0, "candidate": "inf"},
        "speed": {"baseline": 1.0, "candidate": 2.0},
    }


def test_written_files_parse(tmp_path):
    result = compare_reports(fake_report(), fake_report(TwinConfig(scheduler="random")))

    write_compare(result, tmp_path)

    summary = json.loads((tmp_path / "compare.json").read_text())
    assert "reports" not in summary
    assert summary["deltas"] == result["deltas"]
    for role in ("baseline", "candidate"):
        report = json.loads((tmp_path / f"{role}-report.json").read_text())
        assert report["config"] == result["reports"][role]["config"]
    page = parse_page(tmp_path / "compare.html")
    assert page.div_ids == ["figure-ttft_cdf", "figure-loads", "figure-rejections"]
    assert page.script_sources == ["plotly.min.js"]


def test_what_if_runs_both_configs_on_the_same_arrivals(shipped_trace):
    rows = load_trace(shipped_trace, minutes=(0.0, 2.0))
    baseline = TwinConfig(num_prefill=2, num_decode=2, scheduler="random", speed=3.0)
    candidate = baseline.with_changes(scheduler="kvcache-centric")

    result = compare(baseline, candidate, rows, workers=2, trace_label="2min")

    reports = result["reports"]
    # Reports show the SLOs the run used: derived from the profile, the same for both.
    slos = {"ttft_slo_s": None, "tbt_slo_s": None}
    assert {**reports["baseline"]["config"], **slos} == baseline.to_dict()
    assert {**reports["candidate"]["config"], **slos} == candidate.to_dict()
    assert (
        reports["baseline"]["config"]["ttft_slo_s"] == reports["candidate"]["config"]["ttft_slo_s"]
    )
    assert result["changed_settings"] == {
        "scheduler": {"baseline": "random", "candidate": "kvcache-centric"}
    }
    arrivals = [[r["arrival_s"] for r in reports[role]["requests"]] for role in reports]
    assert arrivals[0] == arrivals[1] and len(arrivals[0]) == len(rows)
    rows_by_metric = {row["metric"]: row for row in result["deltas"]}
    assert rows_by_metric["ttft_mean_s"]["baseline"] == reports["baseline"]["ttft_mean_s"]
    # The cache-centric scheduler reuses more of the prompt than random placement.
    assert rows_by_metric["cache_hit_ratio"]["verdict"] == "better"


def test_the_twin_of_a_live_policy_carries_every_policy_setting() -> None:
    """A setting the twin drops is a divergence nobody sees: round-trip every field."""
    from backend.policy.config import PolicyConfig, policy_to_json
    from twin.config import TwinConfig

    live = PolicyConfig(
        block_size=16,
        prefill_scheduler="load-balancing",
        kvcache_balancing_threshold=float("inf"),
        rejection_policy="early",
        eviction_policy="lfu",
        ttft_slo_s=1.5,
        tbt_slo_s=0.05,
        decode_time_s=7.0,
        learn_decode_time=False,
        decode_time_window=32,
        predicted_load_limit=0.9,
        seed=3,
        max_in_flight_requests=77,
    )
    twin = TwinConfig.of_live_policy(policy_to_json(live), num_prefill=2, num_decode=1)
    assert twin.policy_config() == live
