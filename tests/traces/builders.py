"""Builders of trace rows for hand-computed tests."""

from collections.abc import Sequence


def full_blocks_row(timestamp_ms: int, hash_ids: Sequence[int], output_length: int = 1) -> dict:
    """A trace row whose prompt is exactly len(hash_ids) full 512-token blocks."""
    return {
        "timestamp": timestamp_ms,
        "input_length": 512 * len(hash_ids),
        "output_length": output_length,
        "hash_ids": list(hash_ids),
    }
