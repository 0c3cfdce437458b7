"""Requests from arrival to their single terminal outcome, and the decisions made for them.

Keyword-only functions over one Session; each is one unit of work and commits it.
"""

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from backend.db import convert
from backend.db.errors import OutcomeAlreadyRecorded, RequestNotFound
from backend.db.models import DecisionRow, RequestRow
from backend.db.records import DecisionRecord, RequestOutcome, RequestRecord
from backend.policy.effects import DispatchPrefill
from backend.policy.events import RequestArrived


def record_arrival(
    *,
    session: Session,
    arrival: RequestArrived,
    block_size: int,
    api_key_id: str | None = None,
    api_key_name: str | None = None,
) -> RequestRecord:
    """Store a request as it arrives; `block_size` is the tokens per key of its block keys."""
    row = convert.request_row(
        arrival, block_size=block_size, api_key_id=api_key_id, api_key_name=api_key_name
    )
    session.add(row)
    session.commit()
    return convert.request_record(row)


def record_decision(*, session: Session, decision: DispatchPrefill, now_s: float) -> DecisionRecord:
    """Store where a request's prefill went, its cache plan and the predicted timings."""
    row = convert.decision_row(decision, now_s=now_s)
    session.add(row)
    session.commit()
    return convert.decision_record(row)


def record_outcome(*, session: Session, request_id: str, outcome: RequestOutcome) -> RequestRecord:
    """Set the request's terminal state, exactly once.

    Raises OutcomeAlreadyRecorded when it already has one (the guarded UPDATE makes this
    hold even between concurrent writers) and RequestNotFound when it was never recorded.
    A measured TTFT is also stored as the actual TTFT of the request's latest decision.
    """
    result = session.execute(
        update(RequestRow)
        .where(RequestRow.id == request_id, RequestRow.outcome.is_(None))
        .values(**convert.outcome_columns(outcome))
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]  # a CursorResult
        session.rollback()
        recorded = session.scalar(select(RequestRow.outcome).where(RequestRow.id == request_id))
        if recorded is None:
            raise RequestNotFound(request_id)
        raise OutcomeAlreadyRecorded(request_id, recorded, outcome.state)
    if outcome.ttft_s is not None:
        latest_decision = (
            select(DecisionRow.id)
            .where(DecisionRow.request_id == request_id)
            .order_by(DecisionRow.id.desc())
            .limit(1)
            .scalar_subquery()
        )
        session.execute(
            update(DecisionRow)
            .where(DecisionRow.id == latest_decision)
            .values(actual_ttft_s=outcome.ttft_s)
            .execution_options(synchronize_session=False)
        )
    session.commit()
    row = session.get(RequestRow, request_id, populate_existing=True)
    assert row is not None
    return convert.request_record(row)


def end_open_requests(*, session: Session, now_s: float, reason: str, message: str) -> int:
    """End every request still without an outcome as `failed` with `reason`; returns how
    many. A Conductor starting on its database calls it: requests left open were its
    previous incarnation's, and nothing will finish them now."""
    result = session.execute(
        update(RequestRow)
        .where(RequestRow.outcome.is_(None))
        .values(
            outcome="failed",
            outcome_reason=reason,
            outcome_message=message[:1024],
            finished_time_s=now_s,
        )
        .execution_options(synchronize_session=False)
    )
    session.commit()
    return int(result.rowcount)  # type: ignore[attr-defined]


def get_request(*, session: Session, request_id: str) -> RequestRecord | None:
    row = session.get(RequestRow, request_id, populate_existing=True)
    return convert.request_record(row) if row is not None else None


def list_requests(
    *, session: Session, start_s: float, end_s: float, limit: int | None = None
) -> list[RequestRecord]:
    """Requests that arrived in [start_s, end_s), in arrival order."""
    query = (
        select(*RequestRow.__table__.columns)
        .where(RequestRow.arrival_time_s >= start_s, RequestRow.arrival_time_s < end_s)
        .order_by(RequestRow.arrival_time_s, RequestRow.id)
        .limit(limit)
    )
    # Plain rows, not ORM objects: a window may hold many thousand requests, and the records
    # are read-only (convert reads the same attribute names from either).
    return [convert.request_record(row) for row in session.execute(query)]  # type: ignore[arg-type]


def list_decisions(*, session: Session, request_id: str) -> list[DecisionRecord]:
    """The decisions made for one request, oldest first (more than one if re-routed)."""
    query = select(DecisionRow).where(DecisionRow.request_id == request_id).order_by(DecisionRow.id)
    return [convert.decision_record(row) for row in session.scalars(query)]


def list_decisions_between(
    *, session: Session, start_s: float, end_s: float
) -> list[DecisionRecord]:
    """Decisions made in [start_s, end_s), oldest first."""
    query = (
        select(*DecisionRow.__table__.columns)
        .where(DecisionRow.decided_time_s >= start_s, DecisionRow.decided_time_s < end_s)
        .order_by(DecisionRow.decided_time_s, DecisionRow.id)
    )
    return [convert.decision_record(row) for row in session.execute(query)]  # type: ignore[arg-type]
