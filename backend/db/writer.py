"""RequestLogWriter: the request log written behind the serving path, in batches.

`request_log.record_arrival` / `record_decision` / `record_outcome` each open a session and
commit: two commits (and, on SQLite, a fight for the one write lock) on the path of every
request, even one rejected at admission. The writer takes the same three records instead,
returns at once, and one background thread writes whatever has queued up in one
transaction per batch (after letting it gather for `linger_s`), with executemany statements:

- arrivals are inserted, then decisions, then outcomes applied, whatever their order in the
  batch. A request's records are queued in the order arrival < decisions < outcome, so
  this keeps each request's order within a batch, and batches are written in queue order.
- an outcome is the same guarded UPDATE as `record_outcome` (only while `outcome IS NULL`),
  so a request still ends exactly once in the database; an outcome for an unknown request,
  a second outcome, or a record the database refuses (e.g. a decision whose request is
  missing) is logged, counted in `stats` and dropped, and the rest of its batch is written.
- a batch the database cannot take (connection lost, locked) is retried with back-off
  until it goes through or `stop`'s deadline passes; meanwhile records keep queueing, up to
  `max_pending`, past which the record calls wait (back-pressure, not unbounded memory),
  and raise `RecordNotAccepted` after `put_timeout_s`, as a failing synchronous write
  would have raised (`put_timeout_s=0`: never wait, for callers that hold a lock).

`flush()` waits until every record queued before the call is written (or dropped);
`stop()` refuses new records, writes everything queued and joins the thread: nothing the
writer accepted is lost on a clean shutdown while the database answers. A crash loses what
was queued but not yet written (at most one batch's worth of time, milliseconds).
"""

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, desc, insert, select, update
from sqlalchemy.exc import DataError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from backend.db import convert
from backend.db.models import DecisionRow, RequestRow
from backend.db.records import RequestOutcome
from backend.policy.effects import DispatchPrefill
from backend.policy.events import RequestArrived

logger = logging.getLogger(__name__)

DEFAULT_MAX_BATCH = 1000
DEFAULT_MAX_PENDING = 100_000
# Back-off between tries of a batch the database could not take (the last one repeats).
DEFAULT_RETRY_DELAYS_S = (0.01, 0.05, 0.2, 1.0)
DEFAULT_PUT_TIMEOUT_S = 10.0
# How long the writer lets a batch gather after its first record: fewer, larger
# transactions (a record costs about 15x less in a batch of hundreds than alone).
DEFAULT_LINGER_S = 0.02
DEFAULT_STOP_TIMEOUT_S = 30.0

# Errors that blame a record, not the database: retrying the same record cannot help.
_REFUSED = (IntegrityError, DataError, TypeError, ValueError, KeyError)
_REQUESTS = RequestRow.__table__
_DECISIONS = DecisionRow.__table__
_OUTCOME_COLUMNS = tuple(convert.outcome_columns(RequestOutcome("completed", 0.0)))
# The guarded UPDATE of record_outcome, as one executemany statement.
_SET_OUTCOME = (
    update(_REQUESTS)
    .where(_REQUESTS.c.id == bindparam("b_id"), _REQUESTS.c.outcome.is_(None))
    .values({name: bindparam(f"b_{name}") for name in _OUTCOME_COLUMNS})
)
# A measured TTFT also goes on the request's latest decision (as record_outcome does).
_LATEST_DECISION = (
    select(_DECISIONS.c.id)
    .where(_DECISIONS.c.request_id == bindparam("b_request_id"))
    .order_by(desc(_DECISIONS.c.id))
    .limit(1)
    .scalar_subquery()
)
_SET_ACTUAL_TTFT = (
    update(_DECISIONS)
    .where(_DECISIONS.c.id == _LATEST_DECISION)
    .values(actual_ttft_s=bindparam("b_ttft_s"))
)


class RecordNotAccepted(RuntimeError):
    """The writer did not take a record: it is not running, or its queue stayed full for
    `put_timeout_s` (the database has not answered for that long)."""


@dataclass(frozen=True, slots=True)
class _Arrival:
    arrival: RequestArrived
    block_size: int
    api_key_id: str | None
    api_key_name: str | None


@dataclass(frozen=True, slots=True)
class _Decision:
    decision: DispatchPrefill
    now_s: float


@dataclass(frozen=True, slots=True)
class _Outcome:
    request_id: str
    outcome: RequestOutcome


_Record = _Arrival | _Decision | _Outcome


@dataclass(frozen=True, slots=True)
class WriterStats:
    """What the writer has done since it started."""

    num_arrivals: int
    num_decisions: int
    num_outcomes: int
    num_dropped: int  # accepted, then refused by the database or given up at stop
    num_refused: int  # never accepted (RecordNotAccepted raised)
    num_batches: int
    num_retries: int
    num_pending: int
    max_batch_seen: int
    last_error: str | None


class RequestLogWriter:
    """Batched write-behind writer of arrivals, decisions and outcomes; see the module doc.

    Thread-safe: any thread may call the record methods. Call `start()` first (or use it as
    a context manager), `stop()` last.
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_pending: int = DEFAULT_MAX_PENDING,
        retry_delays_s: Sequence[float] = DEFAULT_RETRY_DELAYS_S,
        put_timeout_s: float | None = DEFAULT_PUT_TIMEOUT_S,
        linger_s: float = DEFAULT_LINGER_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if max_batch < 1 or max_pending < 1:
            raise ValueError("max_batch and max_pending must be at least 1")
        if linger_s < 0:
            raise ValueError(f"linger_s must not be negative, got {linger_s}")
        if not retry_delays_s or any(delay < 0 for delay in retry_delays_s):
            raise ValueError("retry_delays_s needs at least one non-negative delay")
        self._sessions = sessions
        self._max_batch = max_batch
        self._max_pending = max_pending
        self._retry_delays_s = tuple(retry_delays_s)
        self._put_timeout_s = put_timeout_s
        self._linger_s = linger_s
        self._num_flushing = 0  # flush() calls waiting: write now, do not linger
        self._sleep = sleep
        self._queue: deque[_Record] = deque()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # queue, progress or state changed
        self._num_queued = 0  # records ever accepted
        self._num_done = 0  # records written or dropped
        self._accepting = False
        self._deadline: float | None = None  # monotonic; past it stop() gives up retrying
        self._thread: threading.Thread | None = None
        self._counts = {"arrivals": 0, "decisions": 0, "outcomes": 0, "dropped": 0, "refused": 0}
        self._num_batches = 0
        self._num_retries = 0
        self._max_batch_seen = 0
        self._last_error: str | None = None

    # -- life ------------------------------------------------------------------------------
    def start(self) -> "RequestLogWriter":
        with self._lock:
            if self._thread is not None:
                raise RuntimeError("the writer was already started")
            self._accepting = True
            self._thread = threading.Thread(
                target=self._loop, name="request-log-writer", daemon=True
            )
        self._thread.start()
        return self

    def stop(self, timeout_s: float | None = DEFAULT_STOP_TIMEOUT_S) -> bool:
        """Refuse new records, write everything queued, join the thread. A database still
        failing `timeout_s` after the call makes the writer drop what is left (logged; None:
        wait for it forever). True when every record accepted was written, none dropped."""
        with self._lock:
            self._accepting = False
            if timeout_s is not None:
                self._deadline = time.monotonic() + timeout_s
            self._changed.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
        with self._lock:
            return self._num_done == self._num_queued and self._counts["dropped"] == 0

    def __enter__(self) -> "RequestLogWriter":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every record queued before this call is written (or dropped), without
        waiting out the linger; False when `timeout_s` passed first."""
        with self._lock:
            target = self._num_queued
            self._num_flushing += 1
            self._changed.notify_all()
            try:
                return self._changed.wait_for(lambda: self._num_done >= target, timeout_s)
            finally:
                self._num_flushing -= 1

    def _should_hurry(self) -> bool:
        return not self._accepting or self._num_flushing > 0 or len(self._queue) >= self._max_batch

    @property
    def stats(self) -> WriterStats:
        with self._lock:
            return WriterStats(
                num_arrivals=self._counts["arrivals"],
                num_decisions=self._counts["decisions"],
                num_outcomes=self._counts["outcomes"],
                num_dropped=self._counts["dropped"],
                num_refused=self._counts["refused"],
                num_batches=self._num_batches,
                num_retries=self._num_retries,
                num_pending=self._num_queued - self._num_done,
                max_batch_seen=self._max_batch_seen,
                last_error=self._last_error,
            )

    # -- records (request_log's three writes, same arguments) --------------------------------
    def record_arrival(
        self,
        *,
        arrival: RequestArrived,
        block_size: int,
        api_key_id: str | None = None,
        api_key_name: str | None = None,
    ) -> None:
        self._put(_Arrival(arrival, block_size, api_key_id, api_key_name))

    def record_decision(self, *, decision: DispatchPrefill, now_s: float) -> None:
        self._put(_Decision(decision, now_s))

    def record_outcome(self, *, request_id: str, outcome: RequestOutcome) -> None:
        self._put(_Outcome(request_id, outcome))

    def _put(self, record: _Record) -> None:
        with self._lock:
            has_room = self._changed.wait_for(
                lambda: not self._accepting or len(self._queue) < self._max_pending,
                self._put_timeout_s,
            )
            if not self._accepting:
                self._counts["refused"] += 1
                raise RecordNotAccepted("the request log writer is not running")
            if not has_room:
                self._counts["refused"] += 1
                raise RecordNotAccepted(
                    f"the request log writer has had {len(self._queue)} records queued for "
                    f"{self._put_timeout_s:g} s (last database error: {self._last_error})"
                )
            self._queue.append(record)
            self._num_queued += 1
            if len(self._queue) == 1:
                self._changed.notify_all()

    # -- the writer thread -----------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._lock:
                self._changed.wait_for(lambda: self._queue or not self._accepting)
                if not self._queue:
                    return  # stopped and drained
                if self._linger_s > 0:  # let a batch gather, unless asked to hurry
                    self._changed.wait_for(self._should_hurry, self._linger_s)
                size = min(len(self._queue), self._max_batch)
                batch = [self._queue.popleft() for _ in range(size)]
                self._changed.notify_all()  # room for writers waiting on max_pending
            try:
                self._write_with_retries(batch)
            except BaseException:  # a bug: never leave flush() or stop() waiting forever
                logger.exception("request log writer: %d records lost", len(batch))
                self._count(dropped=len(batch))
            with self._lock:
                self._num_done += len(batch)
                self._num_batches += 1
                self._max_batch_seen = max(self._max_batch_seen, len(batch))
                self._changed.notify_all()

    def _write_with_retries(self, batch: list[_Record], *, isolate: bool = True) -> None:
        """Write `batch`, retrying while the database fails; a record it refuses (integrity,
        data) is found by writing the batch one record at a time, and dropped alone."""
        attempt = 0
        while True:
            try:
                self._write(batch)
                return
            except _REFUSED as error:
                self._note_error(error)
                if isolate and len(batch) > 1:
                    for record in batch:
                        self._write_with_retries([record], isolate=False)
                    return
                for record in batch:
                    logger.error("request log writer: dropped %s: %s", _describe(record), error)
                self._count(dropped=len(batch))
                return
            except SQLAlchemyError as error:  # the database itself: retry, with back-off
                self._note_error(error)
                if self._past_deadline():
                    logger.error(
                        "request log writer: database still failing at stop (%s); "
                        "%d records dropped",
                        error,
                        len(batch),
                    )
                    self._count(dropped=len(batch))
                    return
                delay = self._retry_delays_s[min(attempt, len(self._retry_delays_s) - 1)]
                attempt += 1
                with self._lock:
                    self._num_retries += 1
                logger.warning("request log writer: batch failed (%s); retry in %g s", error, delay)
                self._sleep(delay)

    def _write(self, batch: list[_Record]) -> None:
        """One transaction: arrivals, then decisions, then outcomes (see the module doc)."""
        arrivals = [_arrival_values(r) for r in batch if isinstance(r, _Arrival)]
        decisions = [_decision_values(r) for r in batch if isinstance(r, _Decision)]
        outcomes = [r for r in batch if isinstance(r, _Outcome)]
        with self._sessions() as session, session.begin():
            if arrivals:
                session.execute(insert(_REQUESTS), arrivals)
            if decisions:
                session.execute(insert(_DECISIONS), decisions)
            applied, refused = self._apply_outcomes(session, outcomes) if outcomes else (0, [])
        self._count(arrivals=len(arrivals), decisions=len(decisions), outcomes=applied)
        if refused:
            self._count(dropped=len(refused))
            for line in refused:
                logger.error("request log writer: %s", line)

    def _apply_outcomes(self, session: Session, outcomes: list[_Outcome]) -> tuple[int, list[str]]:
        """The guarded UPDATEs; returns how many applied and why the others were refused."""
        ids = list({record.request_id for record in outcomes})
        recorded = dict(
            session.execute(
                select(_REQUESTS.c.id, _REQUESTS.c.outcome).where(_REQUESTS.c.id.in_(ids))
            ).all()
        )
        refused: list[str] = []
        rows: list[dict[str, Any]] = []
        ttfts: list[dict[str, Any]] = []
        for record in outcomes:
            state = record.outcome.state
            if record.request_id not in recorded:
                refused.append(f"outcome {state} for unknown request {record.request_id!r}")
                continue
            earlier = recorded[record.request_id]
            if earlier is not None:
                refused.append(
                    f"outcome {state} for request {record.request_id!r}, which already "
                    f"ended {earlier}"
                )
                continue
            recorded[record.request_id] = state
            columns = convert.outcome_columns(record.outcome)
            row = {f"b_{name}": value for name, value in columns.items()}
            row["b_id"] = record.request_id
            rows.append(row)
            if record.outcome.ttft_s is not None:
                ttfts.append({"b_request_id": record.request_id, "b_ttft_s": record.outcome.ttft_s})
        if rows:
            result = session.execute(_SET_OUTCOME, rows)
            dialect = session.get_bind().dialect
            if dialect.supports_sane_multi_rowcount and result.rowcount != len(rows):  # type: ignore[attr-defined]
                # Another writer set some meanwhile; its outcome stands (the guard held).
                refused.append(
                    f"{len(rows) - result.rowcount} outcomes already set by another writer"  # type: ignore[attr-defined]
                )
        if ttfts:
            session.execute(_SET_ACTUAL_TTFT, ttfts)
        return len(rows), refused

    # -- helpers ---------------------------------------------------------------------------
    def _count(self, **numbers: int) -> None:
        with self._lock:
            for name, number in numbers.items():
                self._counts[name] += number

    def _note_error(self, error: BaseException) -> None:
        with self._lock:
            self._last_error = f"{type(error).__name__}: {error}"[:500]

    def _past_deadline(self) -> bool:
        with self._lock:
            return self._deadline is not None and time.monotonic() >= self._deadline


def _arrival_values(record: _Arrival) -> dict[str, Any]:
    row = convert.request_row(
        record.arrival,
        block_size=record.block_size,
        api_key_id=record.api_key_id,
        api_key_name=record.api_key_name,
    )
    return {column.key: getattr(row, column.key) for column in _REQUESTS.columns}


def _decision_values(record: _Decision) -> dict[str, Any]:
    # Rows come from convert (the one row <-> record mapping); the database numbers them.
    row = convert.decision_row(record.decision, now_s=record.now_s)
    return {
        column.key: getattr(row, column.key) for column in _DECISIONS.columns if column.key != "id"
    }


def _describe(record: _Record) -> str:
    if isinstance(record, _Arrival):
        return f"arrival of {record.arrival.request_id!r}"
    if isinstance(record, _Decision):
        return f"decision for {record.decision.request_id!r}"
    return f"outcome {record.outcome.state} of {record.request_id!r}"


__all__ = ["RecordNotAccepted", "RequestLogWriter", "WriterStats"]
