"""Agents as the Conductor has seen them, and per-instance load samples over time.

Keyword-only functions over one Session; each is one unit of work and commits it.
"""

from collections.abc import Sequence

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from backend.db import convert
from backend.db.errors import AgentNotFound
from backend.db.models import AgentRow, LoadSampleRow
from backend.db.records import AGENT_ROLES, AgentRecord, AgentRole, LoadSample


def record_agent_joined(
    *,
    session: Session,
    instance_id: str,
    role: AgentRole,
    rpc_address: str,
    data_address: str | None,
    now_s: float,
    state: str = "active",
) -> AgentRecord:
    """Store an agent that joined, or rejoined under the same instance id (left time cleared)."""
    _check_role(role)
    row = session.get(AgentRow, instance_id)
    if row is None:
        row = AgentRow(instance_id=instance_id)
        session.add(row)
    row.role = role
    row.rpc_address = rpc_address
    row.data_address = data_address
    row.state = state
    row.joined_time_s = now_s
    row.left_time_s = None
    row.last_heartbeat_time_s = now_s
    session.commit()
    return convert.agent_record(row)


def record_agent_heartbeat(*, session: Session, instance_id: str, now_s: float) -> AgentRecord:
    row = _agent(session, instance_id)
    row.last_heartbeat_time_s = now_s
    session.commit()
    return convert.agent_record(row)


def record_agent_state(
    *, session: Session, instance_id: str, state: str, role: AgentRole | None = None
) -> AgentRecord:
    """Change an agent's state (e.g. draining, dead) and, when given, its role."""
    row = _agent(session, instance_id)
    if role is not None:
        _check_role(role)
        row.role = role
    row.state = state
    session.commit()
    return convert.agent_record(row)


def record_agent_left(
    *, session: Session, instance_id: str, now_s: float, state: str = "left"
) -> AgentRecord:
    """Mark an agent gone: `state` "left" when it said goodbye, "dead" when it went silent."""
    row = _agent(session, instance_id)
    row.state = state
    row.left_time_s = now_s
    session.commit()
    return convert.agent_record(row)


def list_agents(*, session: Session, include_left: bool = True) -> list[AgentRecord]:
    query = select(AgentRow).order_by(AgentRow.instance_id)
    if not include_left:
        query = query.where(AgentRow.left_time_s.is_(None))
    return [convert.agent_record(row) for row in session.scalars(query)]


def record_load_samples(*, session: Session, samples: Sequence[LoadSample]) -> int:
    """Store a batch of samples in one INSERT; returns how many."""
    if samples:
        session.execute(insert(LoadSampleRow), [convert.load_sample_row(s) for s in samples])
        session.commit()
    return len(samples)


def list_load_samples(
    *, session: Session, start_s: float, end_s: float, instance_id: str | None = None
) -> list[LoadSample]:
    """Samples taken in [start_s, end_s), by time then instance, optionally of one instance."""
    query = (
        select(*LoadSampleRow.__table__.columns)
        .where(LoadSampleRow.time_s >= start_s, LoadSampleRow.time_s < end_s)
        .order_by(LoadSampleRow.time_s, LoadSampleRow.instance_id, LoadSampleRow.id)
    )
    if instance_id is not None:
        query = query.where(LoadSampleRow.instance_id == instance_id)
    return [convert.load_sample(row) for row in session.execute(query)]  # type: ignore[arg-type]


def _agent(session: Session, instance_id: str) -> AgentRow:
    row = session.get(AgentRow, instance_id)
    if row is None:
        raise AgentNotFound(instance_id)
    return row


def _check_role(role: str) -> None:
    if role not in AGENT_ROLES:
        raise ValueError(f"unknown agent role {role!r}; choose one of {', '.join(AGENT_ROLES)}")
