"""The console's what-if benchmark: a recorded window replayed through the twin twice
(current and proposed), timed end to end the way the What-if page runs it.

The "recorded window" is a window of a trace as GET /v1/export/trace would give it (by
default the first 10 minutes of the shipped conversation trace, optionally length-scaled
as `kvcentric up`'s replay scales what it sends), serialised as Mooncake JSONL and parsed
back by the console's own parser; the live cluster is `kvcentric up`'s (2 prefill + 1
decode `tiny` agents, default policy settings, the measured tiny-cpu profile). The
comparison is `console.whatif.run_whatif`, the function behind the page's progress bar.
"""

import dataclasses
import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.policy.config import PolicyConfig
from backend.traces.loader import TRACE_BLOCK_SIZE, TraceRow, load_trace
from backend.traces.tokens import scaled_input_tokens

ACCEPTANCE_LIMIT_S = 30.0


@dataclass(frozen=True, slots=True)
class WhatIfTiming:
    num_requests: int
    window_minutes: float
    length_scale: float
    num_prefill: int
    num_decode: int
    profile: str
    change: dict[str, Any]
    num_workers: int
    cpu_count: int
    parse_s: float
    compare_s: float
    total_s: float
    num_progress_updates: int
    limit_s: float
    is_within_limit: bool
    baseline: dict[str, Any]
    candidate: dict[str, Any]


def scale_rows(rows: Sequence[TraceRow], length_scale: float) -> list[TraceRow]:
    """Rows as a recording of a replay at `length_scale` would export them: prompts of
    `scaled_input_tokens`, the scaled output length (at least 1), and the trace ids of the
    trace blocks the scaled prompt still reaches."""
    if length_scale == 1.0:
        return list(rows)
    scaled = []
    for row in rows:
        num_tokens = scaled_input_tokens(row.input_length, length_scale=length_scale)
        scaled.append(
            TraceRow(
                timestamp_ms=row.timestamp_ms,
                input_length=num_tokens,
                output_length=max(1, round(row.output_length * length_scale)),
                hash_ids=row.hash_ids[: math.ceil(num_tokens / TRACE_BLOCK_SIZE)],
                line_number=row.line_number,
            )
        )
    return scaled


def to_jsonl(rows: Sequence[TraceRow]) -> bytes:
    lines = (
        json.dumps(
            {
                "timestamp": row.timestamp_ms,
                "input_length": row.input_length,
                "output_length": row.output_length,
                "hash_ids": list(row.hash_ids),
            }
        )
        for row in rows
    )
    return ("\n".join(lines) + "\n").encode()


def measure_whatif(
    trace: Path,
    *,
    minutes: tuple[float, float],
    length_scale: float,
    num_prefill: int,
    num_decode: int,
    profile: str,
    change: dict[str, Any],
) -> WhatIfTiming:
    """Time parsing the window and comparing current vs `change` on it, as the page does."""
    from console.whatif import (  # loads the twin
        ProposedChange,
        live_twin_config,
        proposed_config,
        rows_from_jsonl,
        run_whatif,
    )

    window = to_jsonl(scale_rows(load_trace(trace, minutes=minutes), length_scale))
    agents = [
        {"instance_id": f"{role}-{index}", "role": role, "load": {}}
        for role, count in (("prefill", num_prefill), ("decode", num_decode))
        for index in range(count)
    ]
    current = live_twin_config(dataclasses.asdict(PolicyConfig()), agents, profile=profile)
    candidate = proposed_config(current, ProposedChange(**change))
    updates: list[float] = []
    started_s = time.perf_counter()
    rows = rows_from_jsonl(window, str(trace))
    parsed_s = time.perf_counter()
    result = run_whatif(
        current, candidate, rows, on_progress=lambda fraction, text: updates.append(fraction)
    )
    finished_s = time.perf_counter()
    total_s = finished_s - started_s
    reports = result["reports"]
    return WhatIfTiming(
        num_requests=len(rows),
        window_minutes=minutes[1] - minutes[0],
        length_scale=length_scale,
        num_prefill=num_prefill,
        num_decode=num_decode,
        profile=profile,
        change=change,
        num_workers=max(1, min(2, os.cpu_count() or 1)),
        cpu_count=os.cpu_count() or 1,
        parse_s=parsed_s - started_s,
        compare_s=finished_s - parsed_s,
        total_s=total_s,
        num_progress_updates=len(updates),
        limit_s=ACCEPTANCE_LIMIT_S,
        is_within_limit=total_s <= ACCEPTANCE_LIMIT_S,
        baseline=_run_summary(reports["baseline"]),
        candidate=_run_summary(reports["candidate"]),
    )


def _run_summary(report: dict[str, Any]) -> dict[str, Any]:
    names = ("sim_wall_s", "sim_duration_s", "num_completed", "num_rejected", "ttft_p90_s")
    return {name: report.get(name) for name in names}
