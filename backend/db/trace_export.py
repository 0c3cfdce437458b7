"""Recorded traffic of a time window as a Mooncake-format trace the twin can replay.

Block keys become compact hash ids numbered from 0 in order of first appearance in the
window, so shared prefixes stay shared and the file reads like the public traces.
"""

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

from sqlalchemy.orm import Session

from backend.db.records import RequestRecord, TraceRecord
from backend.db.request_log import list_requests

TRACE_BLOCK_SIZE = 512  # the public traces' tokens per hash id (backend.traces.loader's)


def export_trace(
    *, session: Session, start_s: float, end_s: float, block_size: int = TRACE_BLOCK_SIZE
) -> list[TraceRecord]:
    """Every request that arrived in [start_s, end_s), whatever its outcome, as trace rows.

    Timestamps are whole milliseconds from `start_s`; output_length is the requested
    max tokens (what the client offered, known for rejected requests too).
    """
    return to_trace_records(
        list_requests(session=session, start_s=start_s, end_s=end_s),
        start_s=start_s,
        block_size=block_size,
    )


def to_trace_records(
    requests: Sequence[RequestRecord], *, start_s: float, block_size: int = TRACE_BLOCK_SIZE
) -> list[TraceRecord]:
    """Trace rows for `requests` (in arrival order), hash ids shared by shared prefixes.

    Trace block j (tokens [j*block_size, (j+1)*block_size)) is identified by the chained key
    of the last recorded block inside it, which names the whole prefix up to there. A block
    no recorded key ends in (the partial last block, or block sizes that do not nest) gets
    an id of its own: it was never cacheable, so sharing it would invent cache hits.
    """
    ids: dict[int, int] = {}
    next_id = 0
    records: list[TraceRecord] = []
    for request in requests:
        hash_ids: list[int] = []
        for block in range(math.ceil(request.num_input_tokens / block_size)):
            key = _key_ending_block(request, block, block_size)
            if key is None:
                hash_ids.append(next_id)
                next_id += 1
                continue
            if key not in ids:
                ids[key] = next_id
                next_id += 1
            hash_ids.append(ids[key])
        timestamp_ms = max(0, math.floor((request.arrival_time_s - start_s) * 1000))
        records.append(
            TraceRecord(
                timestamp_ms=timestamp_ms,
                input_length=request.num_input_tokens,
                output_length=request.num_output_tokens,
                hash_ids=tuple(hash_ids),
            )
        )
    return records


def write_trace(path: Path | str, records: Iterable[TraceRecord]) -> int:
    """Write `records` as JSONL to `path`; returns the number of lines written."""
    num_lines = 0
    with open(path, "w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record.to_json_dict(), separators=(",", ":")) + "\n")
            num_lines += 1
    return num_lines


def _key_ending_block(request: RequestRecord, block: int, block_size: int) -> int | None:
    end_tokens = (block + 1) * block_size
    if end_tokens > request.num_input_tokens or end_tokens % request.block_size:
        return None
    key_index = end_tokens // request.block_size - 1
    return request.block_keys[key_index] if key_index < len(request.block_keys) else None
