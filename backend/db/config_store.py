"""Versioned policy configuration and the audit log of every change (who, when, old -> new).

Keyword-only functions over one Session; each is one unit of work and commits it, so a
new configuration version and its audit entry are written together or not at all.
"""

from collections.abc import Mapping
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from backend.db import convert
from backend.db.errors import ConfigVersionConflict
from backend.db.models import AuditRow, ConfigVersionRow
from backend.db.records import AuditEntry, ConfigVersion

CONFIG_ACTION = "config.update"


def get_current_config(*, session: Session) -> ConfigVersion | None:
    """The highest configuration version, or None before the first save."""
    row = session.scalars(
        select(ConfigVersionRow).order_by(ConfigVersionRow.version.desc()).limit(1)
    ).first()
    return convert.config_version(row) if row is not None else None


def get_config_version(*, session: Session, version: int) -> ConfigVersion | None:
    row = session.get(ConfigVersionRow, version)
    return convert.config_version(row) if row is not None else None


def save_config_version(
    *,
    session: Session,
    config: Mapping[str, Any],
    actor: str,
    now_s: float,
    expected_version: int | None = None,
    action: str = CONFIG_ACTION,
    prediction: Mapping[str, Any] | None = None,
) -> tuple[ConfigVersion, AuditEntry]:
    """Save `config` as the next version with its audit entry (old -> new), atomically.

    With `expected_version` (compare-and-set) the save fails with ConfigVersionConflict
    unless the current version is still that one (None: no version yet). Two writers
    racing for the same version number collide on its primary key and one of them gets
    ConfigVersionConflict too. `prediction` attaches the twin's what-if report.
    """
    current = session.scalars(
        select(ConfigVersionRow).order_by(ConfigVersionRow.version.desc()).limit(1)
    ).first()
    current_version = current.version if current is not None else None
    if expected_version is not None and expected_version != current_version:
        session.rollback()
        raise ConfigVersionConflict(expected_version, current_version)
    version_row = ConfigVersionRow(
        version=(current_version or 0) + 1,
        config=dict(config),
        created_time_s=now_s,
        created_by=actor,
    )
    audit_row = AuditRow(
        time_s=now_s,
        actor=actor,
        action=action,
        old_value=dict(current.config) if current is not None else None,
        new_value=dict(config),
        prediction=dict(prediction) if prediction is not None else None,
        config_version=version_row.version,
    )
    try:
        session.add(version_row)
        session.flush()  # the version row must exist before the audit row refers to it
        session.add(audit_row)
        session.commit()
    except IntegrityError:
        session.rollback()
        latest = session.scalar(select(func.max(ConfigVersionRow.version)))
        raise ConfigVersionConflict(current_version, latest) from None
    return convert.config_version(version_row), convert.audit_entry(audit_row)


def record_audit(
    *,
    session: Session,
    actor: str,
    action: str,
    now_s: float,
    old_value: Any,
    new_value: Any,
    prediction: Mapping[str, Any] | None = None,
) -> AuditEntry:
    """Audit a change that is not a configuration version (e.g. an agent's role)."""
    row = AuditRow(
        time_s=now_s,
        actor=actor,
        action=action,
        old_value=old_value,
        new_value=new_value,
        prediction=dict(prediction) if prediction is not None else None,
    )
    session.add(row)
    session.commit()
    return convert.audit_entry(row)


def list_audit(
    *,
    session: Session,
    start_s: float | None = None,
    end_s: float | None = None,
    limit: int | None = 100,
) -> list[AuditEntry]:
    """Audit entries in [start_s, end_s) (open ends when None), newest first."""
    query = select(AuditRow).order_by(AuditRow.time_s.desc(), AuditRow.id.desc()).limit(limit)
    if start_s is not None:
        query = query.where(AuditRow.time_s >= start_s)
    if end_s is not None:
        query = query.where(AuditRow.time_s < end_s)
    return [convert.audit_entry(row) for row in session.scalars(query)]
