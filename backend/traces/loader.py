"""Streaming loader of Mooncake-format JSONL traces with one-line errors naming file and line."""

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

TRACE_BLOCK_SIZE = 512
_MS_PER_MINUTE = 60_000


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One request of a trace: arrival (ms from start), lengths in tokens, prefix block ids."""

    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    line_number: int


class TraceError(ValueError):
    """A malformed trace line; str() is one line: 'FILE:LINE: what is wrong'."""

    def __init__(self, path: Path | str, line_number: int, problem: str) -> None:
        super().__init__(f"{path}:{line_number}: {problem}")
        self.path = str(path)
        self.line_number = line_number
        self.problem = problem


def iter_trace(path: Path | str, block_size: int = TRACE_BLOCK_SIZE) -> Iterator[TraceRow]:
    """Yield the rows of `path` in file order, raising TraceError at the first bad line.

    Reads one line at a time and skips blank lines. Each row must hold integer
    `timestamp` (ms, never going backwards), `input_length` (> 0), `output_length` (>= 0)
    and `hash_ids`, one non-negative integer per `block_size` tokens of input (the last
    block may be partial). A missing file raises FileNotFoundError.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    previous: TraceRow | None = None
    with open(path, "rb") as lines:
        for line_number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = _parse_row(line, line_number, block_size)
            except _RowProblem as problem:
                raise TraceError(path, line_number, str(problem)) from None
            if previous is not None and row.timestamp_ms < previous.timestamp_ms:
                raise TraceError(
                    path,
                    line_number,
                    f"timestamp {row.timestamp_ms} ms goes backwards (line "
                    f"{previous.line_number} has {previous.timestamp_ms} ms); "
                    "rows must be in arrival order",
                )
            previous = row
            yield row


def load_trace(
    path: Path | str,
    block_size: int = TRACE_BLOCK_SIZE,
    minutes: tuple[float, float] | None = None,
) -> list[TraceRow]:
    """The rows of `path`, or only those arriving in `minutes` = (A, B) after the first row.

    The window is [A, B) minutes from the trace's first timestamp; rows keep their original
    `timestamp_ms`. Reading stops at the first row past B, so later lines are not checked.
    """
    if minutes is None:
        return list(iter_trace(path, block_size))
    start_min, end_min = minutes
    rows: list[TraceRow] = []
    first_ms: int | None = None
    for row in iter_trace(path, block_size):
        if first_ms is None:
            first_ms = row.timestamp_ms
        offset_min = (row.timestamp_ms - first_ms) / _MS_PER_MINUTE
        if offset_min >= end_min:
            break
        if offset_min >= start_min:
            rows.append(row)
    return rows


def parse_minutes(text: str) -> tuple[float, float]:
    """Parse a window "A:B" in minutes (0 <= A < B); "A:" runs to the end, ":B" from 0."""
    start_text, colon, end_text = text.partition(":")
    if not colon:
        raise ValueError(f"minutes window must look like A:B (e.g. 0:10), got {text!r}")
    try:
        start_min = float(start_text) if start_text.strip() else 0.0
        end_min = float(end_text) if end_text.strip() else math.inf
    except ValueError:
        raise ValueError(f"minutes window A:B needs numbers, got {text!r}") from None
    if math.isnan(start_min) or math.isnan(end_min) or math.isinf(start_min):
        raise ValueError(f"minutes window A:B needs finite numbers, got {text!r}")
    if start_min < 0:
        raise ValueError(f"minutes window must start at 0 or later, got {text!r}")
    if end_min <= start_min:
        raise ValueError(f"minutes window A:B needs A < B, got {text!r}")
    return start_min, end_min


class _RowProblem(Exception):
    """What is wrong with one line, before the file and line number are attached."""


def _parse_row(line: bytes, line_number: int, block_size: int) -> TraceRow:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise _RowProblem(f"broken JSON: {error.msg} (column {error.colno})") from None
    except ValueError as error:  # bytes that are not UTF-8
        raise _RowProblem(f"broken JSON: {error}") from None
    if not isinstance(record, dict):
        raise _RowProblem(f"expected a JSON object, got {_json_kind(record)}")
    timestamp_ms = _int_field(record, "timestamp")
    input_length = _int_field(record, "input_length")
    output_length = _int_field(record, "output_length")
    if input_length == 0:
        raise _RowProblem("'input_length' must be positive, got 0")
    hash_ids = _hash_ids(record)
    num_blocks_needed = math.ceil(input_length / block_size)
    if len(hash_ids) != num_blocks_needed:
        raise _RowProblem(
            f"'hash_ids' has {len(hash_ids)} ids but input_length {input_length} needs "
            f"{num_blocks_needed} (one per {block_size}-token block)"
        )
    return TraceRow(timestamp_ms, input_length, output_length, hash_ids, line_number)


def _int_field(record: dict, name: str) -> int:
    if name not in record:
        raise _RowProblem(f"missing field {name!r}")
    value = record[name]
    if not _is_int(value):
        raise _RowProblem(f"{name!r} must be an integer, got {_json_kind(value)} {_show(value)}")
    if value < 0:
        raise _RowProblem(f"{name!r} must not be negative, got {value}")
    return value


def _hash_ids(record: dict) -> tuple[int, ...]:
    if "hash_ids" not in record:
        raise _RowProblem("missing field 'hash_ids'")
    value = record["hash_ids"]
    if not isinstance(value, list):
        raise _RowProblem(f"'hash_ids' must be a list of integers, got {_json_kind(value)}")
    for index, hash_id in enumerate(value):
        if not _is_int(hash_id) or hash_id < 0:
            raise _RowProblem(
                f"'hash_ids'[{index}] must be a non-negative integer, got {_show(hash_id)}"
            )
    return tuple(value)


def _is_int(value: object) -> bool:
    # bool is an int subclass in Python, but `true` is not a length or an id.
    return isinstance(value, int) and not isinstance(value, bool)


def _show(value: object, max_chars: int = 40) -> str:
    text = json.dumps(value)
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


def _json_kind(value: object) -> str:
    kinds = {
        bool: "a boolean",
        int: "an integer",
        float: "a float",
        str: "a string",
        list: "a list",
        dict: "an object",
        type(None): "null",
    }
    return kinds.get(type(value), type(value).__name__)
