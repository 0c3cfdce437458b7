"""A recorded time window exported as a Mooncake trace that the trace loader reads back."""

from pathlib import Path

from sqlalchemy.orm import Session

from backend.db.records import RequestOutcome
from backend.db.request_log import record_arrival, record_outcome
from backend.db.trace_export import export_trace, write_trace
from backend.traces.loader import iter_trace
from tests.db.helpers import BIG_KEY, arrival


def test_a_window_exports_as_a_trace_with_shared_prefixes_sharing_ids(
    session: Session, tmp_path: Path
) -> None:
    # 64-token keys, exported as 512-token trace blocks: keys 8, 16, ... end a trace block.
    shared = tuple(range(1, 17))  # 1024 tokens of shared prefix
    before = arrival("early", 999.9, shared, num_input_tokens=1024)
    a = arrival("a", 1000.0, (*shared[:15], BIG_KEY), num_input_tokens=1024 + 10)
    b = arrival("b", 1000.25, (*shared, 101, 102), num_input_tokens=1200, num_output_tokens=7)
    c = arrival("c", 1001.5, shared[:8], num_input_tokens=512)
    after = arrival("late", 1002.0, shared, num_input_tokens=1024)
    for event in (before, a, b, c, after):
        record_arrival(session=session, arrival=event, block_size=64)
    rejected = RequestOutcome("rejected", 1000.3, reason="ttft_slo", stage="admission")
    record_outcome(session=session, request_id="b", outcome=rejected)

    records = export_trace(session=session, start_s=1000.0, end_s=1002.0)
    path = tmp_path / "window.jsonl"
    assert write_trace(path, records) == 3

    rows = list(iter_trace(path))
    assert [(r.timestamp_ms, r.input_length, r.output_length) for r in rows] == [
        (0, 1034, 32),
        (250, 1200, 7),
        (1500, 512, 32),
    ]
    # a: block 0 ends in key 8 (shared), block 1 in BIG_KEY, block 2 is partial.
    # b: block 0 shared with a, block 1 ends in key 16, block 2 partial (its own id).
    # c: its one block is the shared first block.
    assert [r.hash_ids for r in rows] == [(0, 1, 2), (0, 3, 4), (0,)]


def test_an_empty_window_exports_nothing(session: Session, tmp_path: Path) -> None:
    record_arrival(session=session, arrival=arrival("r", 5.0), block_size=512)
    assert export_trace(session=session, start_s=10.0, end_s=20.0) == []
    path = tmp_path / "empty.jsonl"
    assert write_trace(path, []) == 0
    assert list(iter_trace(path)) == []
