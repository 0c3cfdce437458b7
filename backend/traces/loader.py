"""Streaming loader of Mooncake-format JSONL traces with one-line errors naming file and line."""

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

TRACE_BLOCK_SIZE = 512


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
    """Yield the rows of `path` in file order, raising TraceError at the first bad line."""
    raise NotImplementedError  # filled in by the trace toolkit work
