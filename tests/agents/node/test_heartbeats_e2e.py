"""Heartbeats end to end: a real agent process joins the harness Conductor with the shared
secret, pushes its load and KV events every interval, loses no event while the Conductor is
down, and stops its heartbeats on SIGTERM; a wrong secret is refused and retried."""

import itertools
import os
import time

import grpc
import pytest

from backend.policy.blocks import block_keys
from backend.policy.events import KvStored
from backend.rpc import agent_pb2 as pb
from tests.harness.agents import AgentProcess, prefill_request, wait_all
from tests.harness.conductor import HarnessConductor

BLOCK = 64
SECRET = "test-secret-0123456789"
INTERVAL_S = 0.2


@pytest.fixture(scope="module")
def conductor():
    conductor = HarnessConductor(SECRET).start()
    yield conductor
    conductor.stop()


@pytest.fixture(scope="module")
def late_conductor():
    """A Conductor that is down when the agents start (its port is known: started once)."""
    conductor = HarnessConductor(SECRET).start()
    conductor.stop()
    yield conductor
    conductor.stop()


@pytest.fixture(scope="module")
def agents(conductor, late_conductor):
    """A prefill agent with the secret, one whose secret the Conductor refuses, and one
    whose Conductor is down at first and whose backlog holds a single event."""
    flags = ("--heartbeat-interval-s", str(INTERVAL_S))
    good, bad, late = wait_all(
        [
            AgentProcess("prefill", SECRET, "--conductor", conductor.address, *flags),
            AgentProcess(
                "prefill", "a-wrong-secret-0123", "--conductor", conductor.address, *flags
            ),
            AgentProcess(
                "prefill",
                SECRET,
                "--conductor",
                late_conductor.address,
                *flags,
                "--max-backlog-events",
                "1",
            ),
        ]
    )
    yield good, bad, late
    for agent in (good, bad, late):
        if agent.process.poll() is None:
            agent.process.kill()


def _stored_keys(conductor: HarnessConductor, instance_id: str) -> list[int]:
    """Every key stored in the instance's acknowledged heartbeats, in order, repeats kept."""
    return [
        key
        for beat in conductor.heartbeats_of(instance_id)
        for event in beat.events
        if isinstance(event, KvStored)
        for key in event.keys
    ]


def _prefill(agent: AgentProcess, request_id: str, start: int) -> list[int]:
    tokens = list(range(start, start + 2 * BLOCK + 7))
    reply = agent.stub.DispatchPrefill(prefill_request(request_id, tokens))
    assert list(reply.stored_keys) == block_keys(tokens, BLOCK)
    return list(reply.stored_keys)


def _count(agent: AgentProcess, text: str) -> int:
    return sum(text in line for line in list(agent.stderr_lines))


def test_heartbeats_carry_load_and_every_kv_event_once_and_stop_on_sigterm(
    conductor, agents
) -> None:
    agent, _, _ = agents
    me = agent.instance_id
    assert conductor.wait_for(lambda: any(join.instance_id == me for join in conductor.joins))
    join = next(join for join in conductor.joins if join.instance_id == me)
    assert (join.role, join.control_address, join.data_address) == (
        "prefill", agent.control_address, agent.data_address,
    )  # fmt: skip
    assert join.block_size == BLOCK and join.kv_capacity_tokens > 0

    # Periodic heartbeats with the load.
    assert conductor.wait_for(lambda: len(conductor.heartbeats_of(me)) >= 3)
    beats = conductor.heartbeats_of(me)
    assert [beat.sequence for beat in beats] == sorted({beat.sequence for beat in beats})
    assert all(beat.load.dram_capacity_bytes > 0 and not beat.is_final for beat in beats)
    gaps_s = [b.now_s - a.now_s for a, b in itertools.pairwise(beats)]
    assert all(0.5 * INTERVAL_S < gap_s < 10 * INTERVAL_S for gap_s in gaps_s)
    # Each carries this host's CPU counters, read as it was sent (the calibration's measure
    # of what the rest of the host spends beside the agents' work).
    counters = [beat.host_cpu for beat in beats]
    assert all(c is not None and c.cpus == os.cpu_count() for c in counters)
    assert len({c.host_id for c in counters}) == 1
    assert all(
        a.busy_s <= b.busy_s and a.total_s < b.total_s for a, b in itertools.pairwise(counters)
    )

    # A prefill's KvStored events arrive in a heartbeat, and only once after acknowledgement.
    first = _prefill(agent, "hb-1", 1000)
    assert conductor.wait_for(lambda: set(first) <= set(_stored_keys(conductor, me)))
    num_beats = len(conductor.heartbeats_of(me))
    assert conductor.wait_for(lambda: len(conductor.heartbeats_of(me)) >= num_beats + 3)
    assert _stored_keys(conductor, me) == first
    assert conductor.heartbeats_of(me)[-1].load.num_dram_blocks == len(first)

    # The Conductor goes away for a while: the events made meanwhile are delivered later.
    conductor.stop()
    second = _prefill(agent, "hb-2", 2000)
    time.sleep(4 * INTERVAL_S)
    assert _count(agent, "heartbeat to conductor") == 1  # logged once per outage
    conductor.start()
    assert conductor.wait_for(lambda: set(second) <= set(_stored_keys(conductor, me)))
    assert _stored_keys(conductor, me) == first + second
    beats = conductor.heartbeats_of(me)
    assert all(  # acknowledged events are numbered without a gap or a repeat
        b.first_event_index == a.first_event_index + len(a.events)
        for a, b in itertools.pairwise(beats)
    )
    assert all(beat.num_dropped_events == 0 for beat in beats)
    assert conductor.wait_for(lambda: _count(agent, "reachable again") == 1)

    # SIGTERM: a final heartbeat after the drain, then none; the agent exits 0.
    assert agent.terminate() == 0
    last = conductor.heartbeats_of(me)[-1]
    assert last.is_final and last.draining
    num_beats = len(conductor.heartbeats_of(me))
    time.sleep(3 * INTERVAL_S)
    assert len(conductor.heartbeats_of(me)) == num_beats
    assert not any("Traceback" in line for line in agent.stderr_lines)


def test_a_wrong_secret_is_refused_and_the_agent_keeps_retrying_and_serving(
    conductor, agents
) -> None:
    _, agent, _ = agents
    deadline_s = time.monotonic() + 10
    while _count(agent, "wrong shared secret") < 3 and time.monotonic() < deadline_s:
        time.sleep(0.1)
    assert _count(agent, "wrong shared secret") >= 3  # retried, with UNAUTHENTICATED named
    assert _count(agent, "UNAUTHENTICATED") >= 3
    assert all(join.instance_id != agent.instance_id for join in conductor.joins)
    assert not conductor.heartbeats_of(agent.instance_id)

    state = agent.stub.GetState(pb.GetStateRequest())  # it serves all the while
    assert state.instance_id == agent.instance_id
    with pytest.raises(grpc.RpcError) as error:
        agent.bare_stub.GetState(pb.GetStateRequest())
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert agent.terminate() == 0


def test_an_agent_serves_until_its_conductor_is_up_and_counts_dropped_events(
    late_conductor, agents
) -> None:
    _, _, agent = agents
    first = _prefill(agent, "late-1", 3000)  # served with no Conductor to join
    second = _prefill(agent, "late-2", 4000)
    assert _count(agent, "cannot join conductor") >= 1
    late_conductor.start()
    me = agent.instance_id
    assert late_conductor.wait_for(lambda: bool(late_conductor.heartbeats_of(me)))
    # The join's announcement: every block the agent holds, though its backlog holds one
    # event (the announcement supersedes it).
    beat = late_conductor.heartbeats_of(me)[0]
    assert beat.num_dropped_events == 0
    assert set(_stored_keys(late_conductor, me)) == {*first, *second}

    # Joined, then the Conductor is down a while (no restart: it still knows the agent).
    late_conductor.stop()
    num_beats = len(late_conductor.heartbeats_of(me))
    third = _prefill(agent, "late-3", 5000)
    fourth = _prefill(agent, "late-4", 6000)
    late_conductor.start()
    assert late_conductor.wait_for(lambda: len(late_conductor.heartbeats_of(me)) > num_beats)
    beat = late_conductor.heartbeats_of(me)[num_beats]  # the backlog overflowed again
    assert beat.num_dropped_events == 1
    assert [event.keys for event in beat.events] == [tuple(fourth)]
    assert not set(third) & set(_stored_keys(late_conductor, me))
    assert _count(agent, "dropped the 1 oldest") == 1
    assert late_conductor.wait_for(lambda: len(late_conductor.heartbeats_of(me)) > num_beats + 1)
    assert late_conductor.heartbeats_of(me)[num_beats + 1].num_dropped_events == 0
    assert agent.terminate() == 0
