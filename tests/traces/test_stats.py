"""Trace statistics: a hand-computed small trace and the figures of the shipped trace."""

import pytest

from backend.traces.loader import iter_trace
from backend.traces.stats import trace_stats


def test_stats_of_a_small_trace(write_trace):
    path = write_trace(
        [
            {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]},
            {"timestamp": 2000, "input_length": 1536, "output_length": 20, "hash_ids": [0, 1, 2]},
            {"timestamp": 4000, "input_length": 100, "output_length": 30, "hash_ids": [3]},
            {"timestamp": 8000, "input_length": 600, "output_length": 40, "hash_ids": [0, 4]},
        ]
    )

    figures = trace_stats(iter_trace(path))

    assert figures == {
        "requests": 4,
        "span_s": 8.0,
        "arrival_rate_rps": 0.5,  # 4 requests / 8 s
        "avg_input_tokens": 809.0,  # (1000 + 1536 + 100 + 600) / 4
        "p50_input_tokens": 600,  # sorted 100, 600, 1000, 1536: the 2nd of 4
        "p90_input_tokens": 1536,  # ceil(0.9 * 4) = 4th
        "p99_input_tokens": 1536,
        "max_input_tokens": 1536,
        "avg_output_tokens": 25.0,
        "num_blocks": 8,  # 2 + 3 + 1 + 2
        "num_unique_blocks": 5,  # ids 0..4
        "ideal_hit_ratio": 1 - 5 / 8,  # seen before: 0, 1 (row 2) and 0 (row 4)
    }


def test_stats_of_no_rows_are_zeros():
    figures = trace_stats([])

    assert figures["requests"] == 0
    assert figures["num_blocks"] == 0
    assert figures["ideal_hit_ratio"] == 0.0
    assert figures["arrival_rate_rps"] == 0.0


@pytest.mark.slow
def test_shipped_trace_has_the_figures_its_readme_states(shipped_trace):
    figures = trace_stats(iter_trace(shipped_trace))

    assert figures["requests"] == 12_031
    assert round(figures["span_s"]) == 3_537
    assert round(figures["avg_input_tokens"]) == 12_035
    assert round(figures["avg_output_tokens"]) == 343
    assert figures["num_blocks"] == 288_500
    assert figures["num_unique_blocks"] == 182_790
    assert round(figures["ideal_hit_ratio"], 3) == 0.366
