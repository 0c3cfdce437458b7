"""Configuration versions with their audit log (old -> new), on SQLite and PostgreSQL."""

import pytest
from sqlalchemy import event, func, insert, select
from sqlalchemy.orm import Session

from backend.db.config_store import (
    get_config_version,
    get_current_config,
    list_audit,
    record_audit,
    save_config_version,
)
from backend.db.errors import ConfigVersionConflict
from backend.db.models import AuditRow, ConfigVersionRow

V1 = {"prefill_scheduler": "kvcache-centric", "kvcache_balancing_threshold": 2.0}
V2 = {"prefill_scheduler": "kvcache-centric", "kvcache_balancing_threshold": 4.0}


def test_versions_count_up_and_each_save_is_audited_old_to_new(session: Session) -> None:
    assert get_current_config(session=session) is None
    first, first_audit = save_config_version(session=session, config=V1, actor="boot", now_s=1.0)
    assert (first.version, first.config, first.created_by) == (1, V1, "boot")
    assert (first_audit.old_value, first_audit.new_value) == (None, V1)

    prediction = {"ttft_p99_s": 3.2, "rejection_rate": 0.01}
    second, second_audit = save_config_version(
        session=session,
        config=V2,
        actor="admin",
        now_s=2.0,
        expected_version=1,
        prediction=prediction,
    )
    assert second.version == 2
    assert get_current_config(session=session) == second
    assert get_config_version(session=session, version=1) == first
    assert (second_audit.old_value, second_audit.new_value) == (V1, V2)
    assert (second_audit.actor, second_audit.action, second_audit.config_version) == (
        "admin",
        "config.update",
        2,
    )
    assert second_audit.prediction == prediction
    assert list_audit(session=session) == [second_audit, first_audit]
    assert list_audit(session=session, start_s=1.5) == [second_audit]
    assert list_audit(session=session, end_s=1.5) == [first_audit]


def test_a_stale_save_is_refused_and_writes_nothing(session: Session) -> None:
    save_config_version(session=session, config=V1, actor="boot", now_s=1.0)
    save_config_version(session=session, config=V2, actor="a", now_s=2.0, expected_version=1)
    with pytest.raises(ConfigVersionConflict, match="expected current version 1, found 2"):
        save_config_version(session=session, config=V1, actor="b", now_s=3.0, expected_version=1)
    assert session.scalar(select(func.count()).select_from(ConfigVersionRow)) == 2
    assert session.scalar(select(func.count()).select_from(AuditRow)) == 2


def test_a_writer_that_loses_the_race_for_a_version_gets_a_conflict(session: Session) -> None:
    save_config_version(session=session, config=V1, actor="boot", now_s=1.0)

    raced: list[bool] = []

    def another_writer_commits_version_2_first(*_args: object) -> None:
        if raced:
            return
        raced.append(True)
        with session.get_bind().connect() as connection:
            connection.execute(
                insert(ConfigVersionRow),
                {"version": 2, "config": V2, "created_time_s": 2.0, "created_by": "racer"},
            )
            connection.commit()

    event.listen(session, "before_flush", another_writer_commits_version_2_first)
    with pytest.raises(ConfigVersionConflict, match="expected current version 1, found 2"):
        save_config_version(session=session, config=V1, actor="slow", now_s=3.0)
    event.remove(session, "before_flush", another_writer_commits_version_2_first)
    assert raced
    assert get_current_config(session=session).created_by == "racer"
    assert [entry.actor for entry in list_audit(session=session)] == ["boot"]


def test_other_changes_are_audited_too(session: Session) -> None:
    entry = record_audit(
        session=session,
        actor="admin",
        action="agent.role",
        now_s=5.0,
        old_value={"instance_id": "p0", "role": "prefill"},
        new_value={"instance_id": "p0", "role": "decode"},
    )
    assert entry.config_version is None and entry.prediction is None
    assert list_audit(session=session) == [entry]
