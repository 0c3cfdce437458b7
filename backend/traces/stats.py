"""Summary figures of a trace: volume, lengths, arrival rate and the best possible prefix reuse."""

import math
from collections.abc import Iterable

from backend.traces.loader import TraceRow


def trace_stats(rows: Iterable[TraceRow]) -> dict:
    """Figures of `rows` (consumed once, so a streaming `iter_trace` works).

    `ideal_hit_ratio` is 1 - num_unique_blocks / num_blocks: the longest-prefix hit ratio
    of an infinite cache, since a hash id names its block *and* everything before it, so a
    block seen before is always part of a cached prefix.
    """
    num_requests = 0
    num_blocks = 0
    total_output_tokens = 0
    input_lengths: list[int] = []
    unique_ids: set[int] = set()
    first_ms = last_ms = 0
    for row in rows:
        if num_requests == 0:
            first_ms = row.timestamp_ms
        last_ms = row.timestamp_ms
        num_requests += 1
        num_blocks += len(row.hash_ids)
        total_output_tokens += row.output_length
        input_lengths.append(row.input_length)
        unique_ids.update(row.hash_ids)
    input_lengths.sort()
    span_s = (last_ms - first_ms) / 1000
    return {
        "requests": num_requests,
        "span_s": span_s,
        "arrival_rate_rps": num_requests / span_s if span_s > 0 else 0.0,
        "avg_input_tokens": sum(input_lengths) / num_requests if num_requests else 0.0,
        "p50_input_tokens": _percentile(input_lengths, 0.50),
        "p90_input_tokens": _percentile(input_lengths, 0.90),
        "p99_input_tokens": _percentile(input_lengths, 0.99),
        "max_input_tokens": input_lengths[-1] if input_lengths else 0,
        "avg_output_tokens": total_output_tokens / num_requests if num_requests else 0.0,
        "num_blocks": num_blocks,
        "num_unique_blocks": len(unique_ids),
        "ideal_hit_ratio": 1 - len(unique_ids) / num_blocks if num_blocks else 0.0,
    }


def _percentile(sorted_values: list[int], fraction: float) -> int:
    """The smallest value with at least `fraction` of the values at or below it (0 if none)."""
    if not sorted_values:
        return 0
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]
