"""The live report's definitions on hand-made records, number by number."""

import dataclasses

import numpy as np
import pytest

from backend.db.records import LoadSample, RequestOutcome, RequestRecord
from backend.observe.live_report import build_live_report, default_interval_s
from backend.observe.measures import gap_histogram, histogram_percentile, oscillation
from backend.policy import PolicyConfig
from tests.db.helpers import dispatch

CONFIG = PolicyConfig(block_size=512, ttft_slo_s=2.0, tbt_slo_s=0.1)


def _request(request_id: str, arrival_s: float, outcome: RequestOutcome | None) -> RequestRecord:
    return RequestRecord(
        request_id, None, None, arrival_s, 3000, 32, 512, (11, 12), None, None, outcome
    )


def _decision(request_id: str, decided_s: float, fetch: bool):
    from backend.db.records import DecisionRecord

    d = dispatch(request_id, fetch_from="p1" if fetch else None)
    return DecisionRecord(
        0, request_id, decided_s, d.instance_id, d.decode_instance_id, 1,
        "p1" if fetch else None, 3 if fetch else 0, d.plan.num_reused_tokens,
        d.plan.num_compute_tokens, 0.5, 0.2, 1.0, 1.7, None, d.candidates,
    )  # fmt: skip


def _done(at_s: float, ttft_s: float, tbt_s: float, tokens: int = 11) -> RequestOutcome:
    return RequestOutcome(
        "completed", at_s, ttft_s=ttft_s, tbt_mean_s=tbt_s, num_generated_tokens=tokens
    )


REQUESTS = [
    _request("fast", 100.0, _done(102.0, 0.5, 0.05)),
    _request("slow", 101.0, _done(106.0, 3.0, 0.05)),  # misses the TTFT SLO
    _request("late", 102.0, RequestOutcome("rejected", 104.0, reason="tbt", stage="decode")),
    _request("early", 103.0, RequestOutcome("rejected", 103.0, reason="ttft_slo", stage="admission")),  # noqa: E501
    _request("lost", 104.0, RequestOutcome("failed", 105.0, reason="instance p0 lost")),
    _request("running", 105.0, None),
]  # fmt: skip
DECISIONS = [
    _decision("fast", 100.0, fetch=True),
    _decision("slow", 101.0, fetch=False),
    _decision("late", 102.0, fetch=False),
    _decision("lost", 104.0, fetch=False),
    _decision("running", 105.0, fetch=False),
]
SAMPLES = [
    LoadSample(100.0 + t, "p0", prefill_load_s=t * 0.2, memory_used_bytes=1) for t in range(10)
] + [LoadSample(100.0 + t, "d0", decode_load=0.5) for t in range(10)]


def test_the_report_counts_outcomes_slos_cache_and_waste() -> None:
    report = build_live_report(
        CONFIG, REQUESTS, DECISIONS, SAMPLES, start_s=100.0, end_s=110.0, interval_s=5.0
    )
    assert (report["num_requests"], report["num_in_flight"]) == (6, 1)
    assert (report["num_completed"], report["num_rejected"], report["num_failed"]) == (2, 2, 1)
    assert (report["num_rejected_admission"], report["num_rejected_decode"]) == (1, 1)
    assert report["rejected_by_reason"] == {"admission:ttft_slo": 1, "decode:tbt": 1}
    assert report["failed_by_reason"] == {"instance p0 lost": 1}
    assert report["ttft_p50_s"] == pytest.approx(1.75)  # linear between 0.5 and 3.0
    assert report["tbt_p50_s"] == pytest.approx(0.05, rel=0.005)  # the gap histogram's bins
    # One of five finished requests met both SLOs; goodput over the 5-s arrival span (as
    # the twin divides), not the 10-s window.
    assert report["slo_attainment"] == pytest.approx(1 / 5)
    assert report["goodput_rps"] == pytest.approx(0.2)
    # Five dispatched requests of 3,000 tokens, each reusing 2,048 by its plan.
    assert report["cache_hit_ratio"] == pytest.approx(2048 / 3000)
    assert report["block_hit_ratio"] == pytest.approx(4 / 5)  # 4 of 5 full blocks each
    # Wasted: the late-rejected request's computed tokens and predicted prefill time.
    assert (report["wasted_prefill_tokens"], report["wasted_prefill_s"]) == (100, 1.0)
    assert report["num_replicated_blocks"] == 3
    assert report["num_transferred_tokens"] == 3 * 512
    assert report["num_output_tokens"] == 22


def test_the_series_bins_arrivals_outcomes_and_pool_loads() -> None:
    report = build_live_report(
        CONFIG, REQUESTS, DECISIONS, SAMPLES, start_s=100.0, end_s=110.0, interval_s=5.0
    )
    series = report["series"]
    assert series["t_s"] == [0.0, 5.0]
    assert series["admitted"] == [4, 1] and series["completed"] == [1, 1]
    assert series["rejected"] == {"admission:ttft_slo": [1, 0], "decode:tbt": [1, 0]}
    # Prefill load is T_queue over the TTFT SLO: mean of 0, 0.2, ..., 0.8 s over 2 s.
    assert series["prefill_load"] == pytest.approx([0.2, 0.7])
    assert series["decode_load"] == pytest.approx([0.5, 0.5])
    assert series["replicated_blocks"] == [3, 0]
    assert report["decode_load_amplitude"] is None  # too few windows for a rhythm


def test_an_empty_window_has_no_percentiles_and_no_division_by_zero() -> None:
    report = build_live_report(CONFIG, [], [], [], start_s=0.0, end_s=60.0, interval_s=1.0)
    assert report["num_requests"] == 0 and report["ttft_p50_s"] is None
    assert report["cache_hit_ratio"] is None and report["slo_attainment"] is None
    assert len(report["series"]["t_s"]) == 60 and report["series"]["prefill_load"] == []


def test_default_interval_gives_about_sixty_windows_of_at_least_a_second() -> None:
    assert default_interval_s(300.0) == 5.0
    assert default_interval_s(10.0) == 1.0


def test_oscillation_finds_the_period_of_an_anti_phase_square_wave() -> None:
    wave = ([1.0] * 3 + [0.0] * 3) * 6
    amplitude, period_s = oscillation(wave, interval_s=10.0)
    assert amplitude == 1.0 and period_s == 60.0


def test_a_flat_series_has_no_period_even_when_its_noise_repeats() -> None:
    """The Live page showed a load near 0 "oscillating" every 25 s: a rhythm of noise."""
    ripple = ([0.02] * 3 + [0.0] * 2) * 12  # a clean 5-sample rhythm, 2 % of the SLO's load
    amplitude, period_s = oscillation(ripple, interval_s=5.0)
    assert amplitude == 0.02 and period_s is None
    assert oscillation([x * 10 for x in ripple], interval_s=5.0)[1] == 25.0


def test_tbt_percentiles_are_over_every_gap_not_over_request_means() -> None:
    """One sample per gap. A request of 3 gaps of 10 ms and 1 of 1 s has a mean
    of 257.5 ms; over its gaps the median is 10 ms and the p90 1 s (the twin's definition)."""
    gaps = gap_histogram([0.01, 0.01, 0.01, 1.0])
    outcome = dataclasses.replace(_done(102.0, 0.5, 0.2575, tokens=5), tbt_gap_histogram=gaps)
    report = build_live_report(
        CONFIG, [_request("r", 100.0, outcome)], [], [], start_s=100.0, end_s=110.0, interval_s=5.0
    )
    assert report["tbt_p50_s"] == pytest.approx(0.01, rel=0.005)
    assert report["tbt_p90_s"] == pytest.approx(1.0, rel=0.005)


@pytest.mark.parametrize("q", [1, 10, 50, 90, 99])
def test_the_gap_histogram_reads_percentiles_within_half_a_percent(q) -> None:
    gaps = np.random.default_rng(3).lognormal(mean=-4, sigma=1.0, size=20_000)
    exact = float(np.percentile(gaps, q))
    assert histogram_percentile(gap_histogram(gaps), q) == pytest.approx(exact, rel=0.006)
