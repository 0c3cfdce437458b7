"""Agents and load samples, on SQLite and PostgreSQL."""

import pytest
from sqlalchemy.orm import Session

from backend.db.cluster_log import (
    list_agents,
    list_load_samples,
    record_agent_heartbeat,
    record_agent_joined,
    record_agent_left,
    record_agent_state,
    record_load_samples,
)
from backend.db.errors import AgentNotFound
from backend.db.records import LoadSample


def test_an_agent_joins_beats_drains_changes_role_dies_and_rejoins(session: Session) -> None:
    joined = record_agent_joined(
        session=session,
        instance_id="p0",
        role="prefill",
        rpc_address="127.0.0.1:7001",
        data_address="127.0.0.1:8001",
        now_s=10.0,
    )
    assert (joined.state, joined.joined_time_s, joined.left_time_s) == ("active", 10.0, None)
    assert (
        record_agent_heartbeat(session=session, instance_id="p0", now_s=12.5).last_heartbeat_time_s
        == 12.5
    )
    draining = record_agent_state(session=session, instance_id="p0", state="draining")
    assert (draining.state, draining.role) == ("draining", "prefill")
    switched = record_agent_state(session=session, instance_id="p0", state="active", role="decode")
    assert switched.role == "decode"
    dead = record_agent_left(session=session, instance_id="p0", now_s=20.0, state="dead")
    assert (dead.state, dead.left_time_s) == ("dead", 20.0)
    assert list_agents(session=session, include_left=False) == []

    back = record_agent_joined(
        session=session,
        instance_id="p0",
        role="prefill",
        rpc_address="127.0.0.1:7002",
        data_address=None,
        now_s=30.0,
    )
    assert (back.left_time_s, back.rpc_address, back.joined_time_s) == (
        None,
        "127.0.0.1:7002",
        30.0,
    )
    assert list_agents(session=session) == [back]


def test_unknown_agents_and_roles_are_refused(session: Session) -> None:
    with pytest.raises(AgentNotFound, match="no agent 'x'"):
        record_agent_heartbeat(session=session, instance_id="x", now_s=1.0)
    with pytest.raises(ValueError, match="unknown agent role 'both'"):
        record_agent_joined(
            session=session,
            instance_id="x",
            role="both",  # type: ignore[arg-type]
            rpc_address="a",
            data_address=None,
            now_s=1.0,
        )


def test_load_samples_come_back_by_window_and_instance(session: Session) -> None:
    samples = [
        LoadSample(time_s=1.0, instance_id="p0", prefill_load_s=0.5),
        LoadSample(time_s=1.0, instance_id="d0", decode_load=0.7, memory_used_bytes=2**40),
        LoadSample(time_s=2.0, instance_id="p0", prefill_load_s=0.0, memory_capacity_bytes=2**41),
        LoadSample(time_s=3.0, instance_id="p0", prefill_load_s=1.5),
    ]
    assert record_load_samples(session=session, samples=samples) == 4
    assert record_load_samples(session=session, samples=[]) == 0
    assert list_load_samples(session=session, start_s=1.0, end_s=3.0) == [
        samples[1],
        samples[0],
        samples[2],
    ]
    assert list_load_samples(session=session, start_s=0.0, end_s=9.0, instance_id="p0") == [
        samples[0],
        samples[2],
        samples[3],
    ]
