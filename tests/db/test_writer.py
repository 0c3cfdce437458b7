"""RequestLogWriter: batched write-behind of arrivals, decisions and outcomes, on SQLite and
PostgreSQL. What it writes must read back exactly as request_log's synchronous writes."""

import threading
from collections.abc import Callable

import pytest
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from backend.db import request_log
from backend.db.records import RequestOutcome
from backend.db.session import create_session_factory
from backend.db.writer import RecordNotAccepted, RequestLogWriter
from tests.db.helpers import BIG_KEY, BLOCK_SIZE, COMPLETED, arrival, dispatch

REJECTED = RequestOutcome(
    state="rejected",
    finished_time_s=100.001,
    reason="ttft_slo",
    stage="admission",
    message="prefill pool overloaded",
)


class GatedSessions:
    """A session factory whose first `hold` calls wait for `release()` (so records pile up
    into the next batch), and whose first `failures` calls raise OperationalError."""

    def __init__(self, engine: Engine, *, hold: int = 0, failures: int = 0) -> None:
        self._factory = create_session_factory(engine)
        self._gate = threading.Event()
        self.entered = threading.Event()
        self._hold = hold
        self._failures = failures
        self.calls = 0

    def release(self) -> None:
        self._gate.set()

    def __call__(self) -> Session:
        self.calls += 1
        if self.calls <= self._hold:
            self.entered.set()
            assert self._gate.wait(10), "the test never released the writer"
        if self.calls <= self._failures:
            raise OperationalError("BEGIN", {}, ConnectionError("the database is down"))
        return self._factory()


def _writer(sessions: Callable[[], Session], **options: object) -> RequestLogWriter:
    return RequestLogWriter(sessions, sleep=lambda _s: None, **options).start()  # type: ignore[arg-type]


def _fresh(session: Session) -> Session:
    session.rollback()  # a new snapshot: the writer committed on its own connection
    return session


def test_written_records_read_back_like_synchronous_ones(session: Session, engine: Engine):
    writer = _writer(create_session_factory(engine))
    keys = (BIG_KEY, 2**63, 7)
    writer.record_arrival(
        arrival=arrival("r1", 100.0, keys, ttft_slo_s=2.0),
        block_size=BLOCK_SIZE,
        api_key_id="k1",
        api_key_name="alice",
    )
    writer.record_decision(decision=dispatch("r1", "p2", None), now_s=100.1)
    writer.record_decision(decision=dispatch("r1"), now_s=100.5)
    writer.record_outcome(request_id="r1", outcome=COMPLETED)
    writer.record_arrival(arrival=arrival("r2", 100.0), block_size=BLOCK_SIZE)
    writer.record_outcome(request_id="r2", outcome=REJECTED)
    assert writer.flush(10)
    assert writer.stop()

    loaded = request_log.get_request(session=_fresh(session), request_id="r1")
    assert loaded is not None
    assert loaded.block_keys == keys
    assert (loaded.api_key_id, loaded.api_key_name, loaded.ttft_slo_s) == ("k1", "alice", 2.0)
    assert loaded.outcome == COMPLETED
    decisions = request_log.list_decisions(session=session, request_id="r1")
    assert [d.prefill_instance_id for d in decisions] == ["p2", "p0"]
    assert [d.actual_ttft_s for d in decisions] == [None, 1.25]  # on the latest decision
    assert decisions[1].candidates == dispatch("r1").candidates
    assert (decisions[1].fetch_source_instance_id, decisions[1].num_fetch_blocks) == ("p1", 3)
    rejected = request_log.get_request(session=session, request_id="r2")
    assert rejected is not None and rejected.outcome == REJECTED
    stats = writer.stats
    assert (stats.num_arrivals, stats.num_decisions, stats.num_outcomes) == (2, 2, 2)
    assert (stats.num_dropped, stats.num_pending) == (0, 0)


def test_records_queued_meanwhile_go_in_one_batch_in_request_order(
    session: Session, engine: Engine
):
    sessions = GatedSessions(engine, hold=1)
    writer = _writer(sessions)
    writer.record_arrival(arrival=arrival("r0", 99.0), block_size=BLOCK_SIZE)
    assert sessions.entered.wait(10)  # the writer holds r0's batch; the rest queues up
    for index in range(1, 50):
        request_id = f"r{index}"
        writer.record_arrival(arrival=arrival(request_id, 100.0 + index), block_size=BLOCK_SIZE)
        writer.record_decision(decision=dispatch(request_id), now_s=100.0 + index)
        writer.record_outcome(request_id=request_id, outcome=COMPLETED)
    sessions.release()
    assert writer.stop()

    stats = writer.stats
    assert (stats.num_batches, stats.max_batch_seen) == (2, 49 * 3)
    assert (stats.num_arrivals, stats.num_decisions, stats.num_outcomes) == (50, 49, 49)
    requests = request_log.list_requests(session=_fresh(session), start_s=0, end_s=1e9)
    assert [r.request_id for r in requests] == [f"r{i}" for i in range(50)]
    assert all(r.outcome == COMPLETED for r in requests[1:])
    assert requests[0].outcome is None
    for request in requests[1:]:
        (decision,) = request_log.list_decisions(session=session, request_id=request.request_id)
        assert decision.actual_ttft_s == 1.25


def test_a_request_ends_once_and_bad_records_are_dropped_alone(session: Session, engine: Engine):
    sessions = GatedSessions(engine, hold=1)
    writer = _writer(sessions)
    writer.record_arrival(arrival=arrival("r1", 100.0), block_size=BLOCK_SIZE)
    assert sessions.entered.wait(10)
    writer.record_outcome(request_id="r1", outcome=REJECTED)
    writer.record_outcome(request_id="r1", outcome=COMPLETED)  # a second outcome: dropped
    writer.record_outcome(request_id="ghost", outcome=REJECTED)  # never arrived: dropped
    writer.record_decision(decision=dispatch("ghost"), now_s=100.2)  # refused by the FK
    writer.record_arrival(arrival=arrival("r1", 101.0), block_size=BLOCK_SIZE)  # duplicate id
    writer.record_arrival(arrival=arrival("r2", 102.0), block_size=BLOCK_SIZE)
    writer.record_decision(decision=dispatch("r2"), now_s=102.1)
    writer.record_outcome(request_id="r2", outcome=COMPLETED)
    sessions.release()
    assert writer.flush(10)
    writer.record_outcome(request_id="r2", outcome=REJECTED)  # in a later batch: dropped too
    assert not writer.stop()  # something was dropped

    stats = writer.stats
    assert stats.num_dropped == 5
    assert (stats.num_arrivals, stats.num_decisions, stats.num_outcomes) == (2, 1, 2)
    assert stats.last_error is not None
    first = request_log.get_request(session=_fresh(session), request_id="r1")
    assert first is not None and first.outcome == REJECTED and first.arrival_time_s == 100.0
    second = request_log.get_request(session=session, request_id="r2")
    assert second is not None and second.outcome == COMPLETED
    assert request_log.get_request(session=session, request_id="ghost") is None
    assert len(request_log.list_decisions(session=session, request_id="r2")) == 1


def test_a_failing_database_is_retried_until_the_batch_goes_through(
    session: Session, engine: Engine
):
    sessions = GatedSessions(engine, failures=3)
    writer = _writer(sessions, retry_delays_s=(0.0,))
    writer.record_arrival(arrival=arrival("r1", 100.0), block_size=BLOCK_SIZE)
    writer.record_outcome(request_id="r1", outcome=REJECTED)
    assert writer.stop()
    assert writer.stats.num_retries >= 3
    assert "the database is down" in (writer.stats.last_error or "")
    loaded = request_log.get_request(session=_fresh(session), request_id="r1")
    assert loaded is not None and loaded.outcome == REJECTED


def test_stop_gives_up_on_a_dead_database_after_its_timeout(session: Session, engine: Engine):
    sessions = GatedSessions(engine, failures=10**9)
    writer = RequestLogWriter(sessions, retry_delays_s=(0.001,)).start()  # type: ignore[arg-type]
    writer.record_arrival(arrival=arrival("r1", 100.0), block_size=BLOCK_SIZE)
    assert not writer.stop(timeout_s=0.05)
    assert writer.stats.num_dropped == 1 and writer.stats.num_pending == 0


def test_stop_writes_everything_accepted_from_many_threads(session: Session, engine: Engine):
    writer = _writer(create_session_factory(engine), max_batch=64)
    num_threads, per_thread = 4, 150

    def submit(thread: int) -> None:
        for index in range(per_thread):
            request_id = f"t{thread}-{index}"
            writer.record_arrival(arrival=arrival(request_id, 100.0), block_size=BLOCK_SIZE)
            writer.record_outcome(request_id=request_id, outcome=REJECTED)

    threads = [threading.Thread(target=submit, args=(t,)) for t in range(num_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert writer.stop()  # no flush first: stop itself drains the queue
    with pytest.raises(RecordNotAccepted):
        writer.record_arrival(arrival=arrival("late", 100.0), block_size=BLOCK_SIZE)
    requests = request_log.list_requests(session=_fresh(session), start_s=0, end_s=1e9)
    assert len(requests) == num_threads * per_thread
    assert all(r.outcome == REJECTED for r in requests)
    assert writer.stats.max_batch_seen <= 64


def test_a_full_queue_pushes_back_then_refuses(session: Session, engine: Engine):
    sessions = GatedSessions(engine, hold=1)
    writer = _writer(sessions, max_pending=2, put_timeout_s=0.05)
    writer.record_arrival(arrival=arrival("r0", 100.0), block_size=BLOCK_SIZE)
    assert sessions.entered.wait(10)
    writer.record_arrival(arrival=arrival("r1", 100.0), block_size=BLOCK_SIZE)
    writer.record_arrival(arrival=arrival("r2", 100.0), block_size=BLOCK_SIZE)
    with pytest.raises(RecordNotAccepted, match="queued"):
        writer.record_arrival(arrival=arrival("r3", 100.0), block_size=BLOCK_SIZE)
    sessions.release()
    assert writer.stop()
    assert (writer.stats.num_arrivals, writer.stats.num_refused) == (3, 1)


def test_a_writer_that_never_waits_refuses_at_once_when_full(session: Session, engine: Engine):
    sessions = GatedSessions(engine, hold=1)
    writer = _writer(sessions, max_pending=1, put_timeout_s=0)
    writer.record_arrival(arrival=arrival("r0", 100.0), block_size=BLOCK_SIZE)
    assert sessions.entered.wait(10)
    writer.record_arrival(arrival=arrival("r1", 100.0), block_size=BLOCK_SIZE)
    with pytest.raises(RecordNotAccepted):
        writer.record_arrival(arrival=arrival("r2", 100.0), block_size=BLOCK_SIZE)
    sessions.release()
    assert writer.stop()
    assert (writer.stats.num_arrivals, writer.stats.num_refused) == (2, 1)


def test_a_batch_gathers_while_the_writer_lingers_and_flush_cuts_it_short(
    session: Session, engine: Engine
):
    writer = _writer(create_session_factory(engine), linger_s=60.0)
    for index in range(3):
        writer.record_arrival(arrival=arrival(f"r{index}", 100.0), block_size=BLOCK_SIZE)
    assert writer.flush(10)  # well before the linger ends
    assert (writer.stats.num_batches, writer.stats.max_batch_seen) == (1, 3)
    assert len(request_log.list_requests(session=_fresh(session), start_s=0, end_s=1e9)) == 3
    writer.record_arrival(arrival=arrival("r3", 100.0), block_size=BLOCK_SIZE)
    assert writer.stop()  # stopping does not wait out the linger either
    assert writer.stats.num_arrivals == 4


def test_options_are_checked(engine: Engine):
    sessions = create_session_factory(engine)
    with pytest.raises(ValueError):
        RequestLogWriter(sessions, max_batch=0)
    with pytest.raises(ValueError):
        RequestLogWriter(sessions, retry_delays_s=())
    with pytest.raises(ValueError):
        RequestLogWriter(sessions, linger_s=-1)
    writer = RequestLogWriter(sessions)
    with pytest.raises(RecordNotAccepted):  # not started
        writer.record_arrival(arrival=arrival("r1", 100.0), block_size=BLOCK_SIZE)
    with writer, pytest.raises(RuntimeError):
        writer.start()
