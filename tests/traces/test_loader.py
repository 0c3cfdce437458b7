"""The streaming trace loader: good rows, every kind of bad line, time windows."""

import math

import pytest

from backend.traces.loader import TraceError, TraceRow, iter_trace, load_trace, parse_minutes
from tests.traces.builders import full_blocks_row


def test_rows_come_back_in_file_order_with_line_numbers_and_blank_lines_skipped(write_trace):
    path = write_trace(
        [
            '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [7, 8]}',
            "",
            "   ",
            '{"timestamp": 250, "input_length": 512, "output_length": 0, "hash_ids": [7]}',
        ]
    )

    rows = list(iter_trace(path))

    assert rows == [
        TraceRow(timestamp_ms=0, input_length=600, output_length=5, hash_ids=(7, 8), line_number=1),
        TraceRow(timestamp_ms=250, input_length=512, output_length=0, hash_ids=(7,), line_number=4),
    ]


def test_extra_fields_are_ignored(write_trace):
    path = write_trace([{**full_blocks_row(0, [1]), "session": "abc"}])

    assert [row.hash_ids for row in iter_trace(path)] == [(1,)]


def test_block_size_decides_how_many_ids_a_prompt_needs(write_trace):
    path = write_trace(
        [{"timestamp": 0, "input_length": 33, "output_length": 1, "hash_ids": [1, 2, 3]}]
    )

    assert [row.hash_ids for row in iter_trace(path, block_size=16)] == [(1, 2, 3)]
    with pytest.raises(TraceError, match="has 3 ids but input_length 33 needs 1"):
        list(iter_trace(path))


GOOD = {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]}

BAD_LINES = [
    ('{"timestamp": 0, "input_length": ', "broken JSON"),
    ("[1, 2, 3]", "expected a JSON object, got a list"),
    ('"text"', "expected a JSON object, got a string"),
    ({k: v for k, v in GOOD.items() if k != "timestamp"}, "missing field 'timestamp'"),
    ({k: v for k, v in GOOD.items() if k != "input_length"}, "missing field 'input_length'"),
    ({k: v for k, v in GOOD.items() if k != "output_length"}, "missing field 'output_length'"),
    ({k: v for k, v in GOOD.items() if k != "hash_ids"}, "missing field 'hash_ids'"),
    ({**GOOD, "timestamp": 1.5}, "'timestamp' must be an integer, got a float 1.5"),
    ({**GOOD, "input_length": 1000.0}, "'input_length' must be an integer, got a float 1000.0"),
    ({**GOOD, "output_length": True}, "'output_length' must be an integer, got a boolean true"),
    ({**GOOD, "input_length": "1000"}, "'input_length' must be an integer, got a string"),
    ({**GOOD, "timestamp": -1}, "'timestamp' must not be negative, got -1"),
    ({**GOOD, "input_length": -1000}, "'input_length' must not be negative, got -1000"),
    ({**GOOD, "output_length": -1}, "'output_length' must not be negative, got -1"),
    ({**GOOD, "input_length": 0, "hash_ids": []}, "'input_length' must be positive, got 0"),
    ({**GOOD, "hash_ids": "1,2"}, "'hash_ids' must be a list of integers, got a string"),
    ({**GOOD, "hash_ids": [1, -2]}, "'hash_ids'\\[1\\] must be a non-negative integer, got -2"),
    ({**GOOD, "hash_ids": [1, 2.0]}, "'hash_ids'\\[1\\] must be a non-negative integer, got 2.0"),
    ({**GOOD, "hash_ids": [False, 2]}, "'hash_ids'\\[0\\] must be a non-negative integer"),
    ({**GOOD, "hash_ids": [1]}, "'hash_ids' has 1 ids but input_length 1000 needs 2"),
    ({**GOOD, "hash_ids": [1, 2, 3]}, "'hash_ids' has 3 ids but input_length 1000 needs 2"),
]


@pytest.mark.parametrize(("bad_line", "problem"), BAD_LINES)
def test_a_bad_line_raises_one_line_error_naming_file_and_line(write_trace, bad_line, problem):
    path = write_trace([full_blocks_row(0, [1]), "", bad_line])

    with pytest.raises(TraceError, match=problem) as raised:
        list(iter_trace(path))

    error = raised.value
    assert (error.path, error.line_number) == (str(path), 3)
    assert str(error).startswith(f"{path}:3: ")
    assert "\n" not in str(error)


def test_rows_before_a_bad_line_are_yielded_before_the_error(write_trace):
    path = write_trace([full_blocks_row(0, [1]), "not json"])
    rows = iter_trace(path)

    assert next(rows).hash_ids == (1,)
    with pytest.raises(TraceError, match=":2: broken JSON"):
        next(rows)


def test_bytes_that_are_not_utf8_are_broken_json(tmp_path):
    path = tmp_path / "binary.jsonl"
    path.write_bytes(b'{"timestamp": "\xff\xfe"}\n')

    with pytest.raises(TraceError, match=":1: broken JSON"):
        list(iter_trace(path))


def test_timestamps_going_backwards_are_refused_but_equal_ones_are_fine(write_trace):
    path = write_trace(
        [full_blocks_row(100, [1]), full_blocks_row(100, [2]), full_blocks_row(99, [3])]
    )

    with pytest.raises(
        TraceError, match=r":3: timestamp 99 ms goes backwards \(line 2 has 100 ms\)"
    ):
        list(iter_trace(path))


def test_a_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        list(iter_trace(tmp_path / "absent.jsonl"))


def test_load_trace_keeps_the_window_measured_from_the_first_row(write_trace):
    # First row at 1 s; windows are minutes after it, rows keep their own timestamps.
    arrivals_ms = [1_000, 30_000, 61_000, 90_000, 121_000, 200_000]
    path = write_trace([full_blocks_row(ms, [i]) for i, ms in enumerate(arrivals_ms)])

    assert len(load_trace(path)) == 6
    assert [r.timestamp_ms for r in load_trace(path, minutes=(0, 1))] == [1_000, 30_000]
    assert [r.timestamp_ms for r in load_trace(path, minutes=(1, 2))] == [61_000, 90_000]
    assert [r.timestamp_ms for r in load_trace(path, minutes=(2, math.inf))] == [121_000, 200_000]
    assert load_trace(path, minutes=(10, 20)) == []


def test_load_trace_stops_reading_after_the_window(write_trace):
    path = write_trace([full_blocks_row(0, [1]), full_blocks_row(120_000, [2]), "not json"])

    assert [r.hash_ids for r in load_trace(path, minutes=(0, 1))] == [(1,)]
    with pytest.raises(TraceError):
        load_trace(path)


@pytest.mark.parametrize(
    ("text", "window"),
    [("0:10", (0.0, 10.0)), ("2.5:3", (2.5, 3.0)), (":5", (0.0, 5.0)), ("5:", (5.0, math.inf))],
)
def test_parse_minutes_reads_a_window(text, window):
    assert parse_minutes(text) == window


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("10", "must look like A:B"),
        ("a:b", "needs numbers"),
        ("5:3", "needs A < B"),
        ("4:4", "needs A < B"),
        ("-1:3", "start at 0 or later"),
        ("nan:3", "finite numbers"),
    ],
)
def test_parse_minutes_explains_a_bad_window(text, problem):
    with pytest.raises(ValueError, match=problem):
        parse_minutes(text)
