"""What to send and when: one native request body per trace row, at its scaled arrival time.

Pure: no I/O and no clock, so the schedule can be checked by building rows directly.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from backend.traces.loader import TraceRow

_MS_PER_S = 1000.0


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """The replay's knobs: time compression, prompt/output scaling and the output cap."""

    speed: float = 1.0
    length_scale: float = 1.0
    max_tokens_cap: int | None = None

    def __post_init__(self) -> None:
        if not self.speed > 0:
            raise ValueError(f"speed must be positive, got {self.speed}")
        if not 0 < self.length_scale <= 1:
            raise ValueError(f"length_scale must be in (0, 1], got {self.length_scale}")
        if self.max_tokens_cap is not None and self.max_tokens_cap < 1:
            raise ValueError(f"max_tokens_cap must be at least 1, got {self.max_tokens_cap}")


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One request to send: its trace line, when (s after the replay starts) and the body."""

    line_number: int
    send_at_s: float
    body: dict[str, object]


def plan_requests(rows: Sequence[TraceRow], config: ReplayConfig) -> list[PlannedRequest]:
    """A streamed, trace-style native request per row, timed from the first row's arrival.

    The prompt is sent as hash ids (prefixes shared exactly as in the trace) shrunk by
    `length_scale` on the server; the output is the trace's output length scaled the same
    way, at least one token, capped, and generated in full (`ignore_eos`).
    """
    if not rows:
        return []
    first_ms = rows[0].timestamp_ms
    return [
        PlannedRequest(
            line_number=row.line_number,
            send_at_s=(row.timestamp_ms - first_ms) / _MS_PER_S / config.speed,
            body=_body(row, config),
        )
        for row in rows
    ]


def scaled_max_tokens(output_length: int, config: ReplayConfig) -> int:
    """Output tokens to ask for: round(output_length * length_scale), at least 1, capped."""
    num_tokens = max(1, round(output_length * config.length_scale))
    if config.max_tokens_cap is not None:
        num_tokens = min(num_tokens, config.max_tokens_cap)
    return num_tokens


def _body(row: TraceRow, config: ReplayConfig) -> dict[str, object]:
    body: dict[str, object] = {
        "hash_ids": list(row.hash_ids),
        "input_length": row.input_length,
        "max_tokens": scaled_max_tokens(row.output_length, config),
        "ignore_eos": True,
        "stream": True,
    }
    if config.length_scale != 1.0:
        body["length_scale"] = config.length_scale
    return body
