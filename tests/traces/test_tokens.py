"""Token ids of trace rows: exact lengths, and shared tokens and block keys where ids agree."""

import numpy as np
import pytest

from backend.policy.blocks import block_keys
from backend.traces.loader import TraceRow
from backend.traces.tokens import scaled_input_tokens, trace_token_ids


def test_a_row_becomes_exactly_input_length_int32_tokens_in_the_vocabulary():
    row = TraceRow(
        timestamp_ms=0, input_length=1200, output_length=1, hash_ids=(4, 5, 6), line_number=1
    )

    tokens = trace_token_ids(row, vocab_size=1000)

    assert tokens.dtype == np.int32
    assert len(tokens) == 1200
    assert tokens.min() >= 0 and tokens.max() < 1000
    np.testing.assert_array_equal(tokens, trace_token_ids(((4, 5, 6), 1200), vocab_size=1000))


def test_requests_share_tokens_and_block_keys_exactly_where_their_ids_agree():
    first = trace_token_ids(([0, 14, 15, 16], 2000))
    second = trace_token_ids(([0, 14, 28, 29], 1900))

    np.testing.assert_array_equal(first[: 2 * 512], second[: 2 * 512])
    assert not np.array_equal(first[2 * 512 : 3 * 512], second[2 * 512 : 3 * 512])
    first_keys, second_keys = block_keys(first, 512), block_keys(second, 512)
    assert len(first_keys) == len(second_keys) == 3  # 2000 and 1900 tokens: 3 full blocks
    assert first_keys[:2] == second_keys[:2]
    assert first_keys[2] != second_keys[2]


def test_a_partial_last_block_is_the_start_of_the_same_id_in_full():
    short = trace_token_ids(([3, 7], 700))  # block 7 cut to 188 tokens
    long = trace_token_ids(([3, 7, 8], 1300))

    np.testing.assert_array_equal(short, long[:700])
    assert block_keys(short, 512) == block_keys(long, 512)[:1]


def test_a_block_does_not_depend_on_the_request_it_is_in():
    alone = trace_token_ids(([9], 512))
    later = trace_token_ids(([1, 2, 9], 1536))

    np.testing.assert_array_equal(alone, later[1024:])


@pytest.mark.parametrize(
    ("input_length", "length_scale", "num_tokens"),
    [
        (1536, 0.125, 192),  # 3 full blocks of 64
        (1200, 0.125, 150),  # 1200 = 2 * 512 + 176 -> 2 * 64 + round(176 * 0.125) = 150
        (1, 0.125, 1),  # a partial block keeps at least one token
        (1000, 1.0, 1000),
    ],
)
def test_length_scale_shrinks_every_block_alike(input_length, length_scale, num_tokens):
    ids = list(range(-(-input_length // 512)))

    tokens = trace_token_ids((ids, input_length), length_scale=length_scale)

    assert len(tokens) == num_tokens
    assert scaled_input_tokens(input_length, length_scale=length_scale) == num_tokens


def test_length_scale_keeps_prefix_sharing_exact_in_scaled_blocks():
    first = trace_token_ids(([0, 14, 15], 1536), length_scale=0.125)
    second = trace_token_ids(([0, 14, 28], 1536), length_scale=0.125)

    assert block_keys(first, 64)[:2] == block_keys(second, 64)[:2]
    assert block_keys(first, 64)[2] != block_keys(second, 64)[2]
    assert block_keys(first, 16)[:8] == block_keys(second, 16)[:8]
    assert block_keys(first, 16)[8] != block_keys(second, 16)[8]


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"length_scale": 0.0}, "length_scale must be in"),
        ({"length_scale": 1.5}, "length_scale must be in"),
        ({"vocab_size": 0}, "vocab_size must be positive"),
        ({"block_size": 0}, "block_size must be positive"),
    ],
)
def test_bad_options_are_refused(kwargs, problem):
    with pytest.raises(ValueError, match=problem):
        trace_token_ids(([1], 100), **kwargs)


def test_ids_that_do_not_fit_the_length_are_refused():
    with pytest.raises(ValueError, match="2 hash ids do not fit input_length 100"):
        trace_token_ids(([1, 2], 100))


def test_ids_beyond_64_bits_give_tokens_not_an_overflow():
    """A client may send any non-negative id (the native API's hash_ids): no error for one
    past 64 bits, and its tokens are drawn from it as from any other id."""
    tokens = trace_token_ids(([2**70, 5], 1000), vocab_size=1000)
    assert len(tokens) == 1000 and tokens.min() >= 0 and tokens.max() < 1000
    np.testing.assert_array_equal(tokens[:512], trace_token_ids(([2**70], 512), vocab_size=1000))


def test_tokens_are_spread_evenly_over_the_vocabulary():
    counts = np.bincount(trace_token_ids((list(range(500)), 500 * 512), vocab_size=100))
    assert len(counts) == 100
    expected = 500 * 512 / 100
    assert np.abs(counts - expected).max() < 6 * np.sqrt(expected)  # Poisson-like spread
