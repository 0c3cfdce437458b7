"""The replay schedule and bodies, built from trace rows directly."""

import pytest

from backend.loadgen.plan import ReplayConfig, plan_requests, scaled_max_tokens
from backend.loadgen.results import percentile
from backend.traces.loader import TraceRow


def test_send_times_follow_arrivals_compressed_by_speed():
    rows = [
        TraceRow(1000, 600, 100, (1, 2), 1),
        TraceRow(1000, 100, 10, (1,), 2),
        TraceRow(4000, 512, 3, (7,), 5),
    ]
    planned = plan_requests(rows, ReplayConfig(speed=2.0, length_scale=0.5, max_tokens_cap=40))
    assert [p.send_at_s for p in planned] == [0.0, 0.0, 1.5]
    assert [p.line_number for p in planned] == [1, 2, 5]
    assert planned[0].body == {
        "hash_ids": [1, 2],
        "input_length": 600,
        "max_tokens": 40,
        "ignore_eos": True,
        "stream": True,
        "length_scale": 0.5,
    }
    assert [p.body["max_tokens"] for p in planned] == [40, 5, 2]


@pytest.mark.parametrize(
    ("output_length", "scale", "cap", "expected"),
    [(500, 0.02, None, 10), (0, 1.0, None, 1), (3, 0.02, None, 1), (500, 1.0, 64, 64)],
)
def test_output_tokens_are_scaled_at_least_one_and_capped(output_length, scale, cap, expected):
    config = ReplayConfig(length_scale=scale, max_tokens_cap=cap)
    assert scaled_max_tokens(output_length, config) == expected


@pytest.mark.parametrize("knobs", [{"speed": 0.0}, {"length_scale": 0.0}, {"max_tokens_cap": 0}])
def test_bad_knobs_are_refused(knobs):
    with pytest.raises(ValueError):
        ReplayConfig(**knobs)


def test_percentile_interpolates_between_ranks():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 90) == 5.0
