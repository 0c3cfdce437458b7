"""Trace rows as the Conductor core's RequestArrived events, for every replay driver."""

from collections.abc import Sequence

from backend.policy.events import RequestArrived
from backend.traces.loader import TraceRow


def arrivals_from_rows(
    rows: Sequence[TraceRow], *, block_size: int, speed: float = 1.0
) -> list[RequestArrived]:
    """RequestArrived events of `rows`, timed from the first row at replay `speed`.

    The trace's hash ids of full blocks are the block keys: like chained keys, an id names
    a block together with its whole prefix, so no tokens need generating. Request ids are
    "r" + the row's line number.
    """
    if not rows:
        return []
    start_ms = rows[0].timestamp_ms
    return [
        RequestArrived(
            now_s=(row.timestamp_ms - start_ms) / 1000.0 / speed,
            request_id=f"r{row.line_number}",
            block_keys=tuple(row.hash_ids[: row.input_length // block_size]),
            num_input_tokens=row.input_length,
            num_output_tokens=row.output_length,
        )
        for row in rows
    ]
