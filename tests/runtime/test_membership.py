"""Joins, heartbeats and dead-agent detection over the real Conductor gRPC service, with the
runtime's clock under the test's control (no agent processes needed)."""

import threading
import time
from concurrent import futures

import grpc
import pytest

from backend.db import request_log
from backend.metrics import ConductorMetrics
from backend.policy import events as ev
from backend.rpc import agent_pb2 as pb
from backend.rpc import agent_pb2_grpc as pb_grpc
from backend.rpc.auth import call_metadata
from backend.runtime import ConductorRuntime
from tests.runtime.conftest import BLOCK, COST, SECRET, make_settings


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def conductor():
    clock = Clock()
    runtime = ConductorRuntime(
        make_settings(heartbeat_timeout_s=3.0, heartbeat_interval_s=1.0),
        COST,
        clock=clock,
        grpc_address="127.0.0.1:0",
    ).start(watch=False)  # the test checks heartbeats itself
    channel = grpc.insecure_channel(runtime.address)
    yield runtime, clock, pb_grpc.ConductorStub(channel)
    channel.close()
    runtime.stop()


def _join(instance_id: str, role: int, block_size: int = BLOCK) -> pb.JoinRequest:
    return pb.JoinRequest(
        instance_id=instance_id,
        role=role,
        control_address="127.0.0.1:1",
        data_address="127.0.0.1:2",
        block_size=block_size,
        kv_capacity_tokens=4096,
    )


def _beat(instance_id: str, keys: list[int]) -> pb.HeartbeatRequest:
    stored = pb.KvEvent(
        kind=pb.KvEvent.STORED, now_s=1e9, instance_id=instance_id, keys=keys, tier=pb.DRAM
    )
    return pb.HeartbeatRequest(
        instance_id=instance_id, sequence=1, role=pb.PREFILL, events=[stored]
    )


def test_calls_without_the_secret_are_refused(conductor) -> None:
    _, _, stub = conductor
    with pytest.raises(grpc.RpcError) as error:
        stub.Join(_join("p1", pb.PREFILL))
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_join_heartbeat_and_death_by_silence(conductor) -> None:
    runtime, clock, stub = conductor
    metrics = ConductorMetrics(block_size=BLOCK)
    runtime.attach_metrics(metrics)
    secret = call_metadata(SECRET)
    unknown = stub.Heartbeat(_beat("p1", [1]), metadata=secret)
    assert unknown.rejoin and not unknown.acknowledged

    wrong = stub.Join(_join("p0", pb.PREFILL, block_size=BLOCK * 2), metadata=secret)
    assert not wrong.accepted and "block size" in wrong.message
    assert f"--block-size {BLOCK}" in wrong.message  # what to do about it
    reply = stub.Join(_join("p1", pb.PREFILL), metadata=secret)
    assert reply.accepted and reply.heartbeat_interval_s == 1.0
    assert runtime.agents()["p1"].join.data_address == "127.0.0.1:2"

    clock.now_s += 2.0
    assert stub.Heartbeat(_beat("p1", [11, 12]), metadata=secret).acknowledged
    assert runtime.core.index.prefix_blocks((11, 12), ["p1"]) == {"p1": 2}
    assert 'instance_id="p1"' in metrics.render().decode()  # its load gauges
    clock.now_s += 2.5  # 2.5 s since the last heartbeat: within the timeout
    assert runtime.check_heartbeats() == []

    clock.now_s += 1.0
    assert runtime.check_heartbeats() == ["p1"]
    assert "p1" not in runtime.agents() and "missed heartbeats" in runtime.left()["p1"]
    assert "p1" not in runtime.core.prefill
    assert 'instance_id="p1"' not in metrics.render().decode()  # gone with it
    assert stub.Heartbeat(_beat("p1", [13]), metadata=secret).rejoin


class HungAgent(pb_grpc.AgentServicer):
    """An agent that accepts a prefill and never answers until released (a hung node)."""

    def __init__(self) -> None:
        self.called = threading.Event()
        self.release = threading.Event()

    def DispatchPrefill(self, request, context):
        self.called.set()
        self.release.wait(10)
        return pb.DispatchPrefillReply(request_id=request.request_id, first_token=1)


def test_in_flight_prefill_on_a_silent_agent_fails_once_and_rejections_are_terminal(
    conductor,
) -> None:
    runtime, clock, stub = conductor
    secret = call_metadata(SECRET)
    hung = HungAgent()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_AgentServicer_to_server(hung, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        join = _join("p1", pb.PREFILL)
        join.control_address = f"127.0.0.1:{port}"
        assert stub.Join(join, metadata=secret).accepted
        assert stub.Join(_join("d1", pb.DECODE), metadata=secret).accepted

        refused = runtime.submit("too-fast", list(range(1, 200)), 4, ttft_slo_s=1e-9)
        outcome = refused.result(5)
        assert (outcome.state, outcome.stage) == ("rejected", "admission")
        assert refused.retry_after_s is not None

        stream = runtime.submit("r1", list(range(1, 200)), 4)
        assert hung.called.wait(5)
        clock.now_s += 4.0
        decode_beat = pb.HeartbeatRequest(instance_id="d1", sequence=1, role=pb.DECODE)
        assert stub.Heartbeat(decode_beat, metadata=secret).acknowledged
        assert runtime.check_heartbeats() == ["p1"]
        outcome = stream.result(5)
        assert outcome.state == "failed" and "p1 lost: missed heartbeats" in (outcome.reason or "")
        hung.release.set()  # the late reply must not end the request a second time
        time.sleep(0.2)
        assert stream.outcome is outcome and runtime.core.num_in_flight == 0
    finally:
        hung.release.set()
        server.stop(grace=0)


def test_finished_requests_are_forgotten_beyond_the_limit_but_stay_recorded(sessions) -> None:
    runtime = ConductorRuntime(
        make_settings(), COST, session_factory=sessions, grpc_address="127.0.0.1:0",
        max_finished_requests=2,
    )  # fmt: skip
    try:
        for number in range(3):  # no agents: each is refused at admission
            runtime.submit(f"r{number}", [1, 2, 3], 2).result(5)
        assert runtime.request("r0") is None
        assert runtime.request("r1") is not None and runtime.request("r2") is not None
        assert runtime.flush_records()
        with sessions() as session:
            assert request_log.get_request(session=session, request_id="r0").outcome is not None
    finally:
        runtime.stop()


def test_a_fast_restart_under_the_same_id_is_noticed_and_fails_what_the_old_one_held(
    conductor,
) -> None:
    """The new process joins before the old one's silence is noticed: its incarnation says
    it is new, so the old one's blocks leave the index and its running prefill fails."""
    runtime, _clock, stub = conductor
    secret = call_metadata(SECRET)
    hung = HungAgent()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_AgentServicer_to_server(hung, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        old = _join("p1", pb.PREFILL)
        old.control_address, old.incarnation = f"127.0.0.1:{port}", "first"
        assert stub.Join(old, metadata=secret).accepted
        assert stub.Join(_join("d1", pb.DECODE), metadata=secret).accepted
        assert stub.Heartbeat(_beat("p1", [21, 22, 23]), metadata=secret).acknowledged
        assert runtime.core.index.num_blocks("p1") == 3

        stream = runtime.submit("r1", list(range(1, 200)), 4)
        assert hung.called.wait(5)
        new = _join("p1", pb.PREFILL)
        new.control_address, new.incarnation = f"127.0.0.1:{port}", "second"
        assert stub.Join(new, metadata=secret).accepted
        outcome = stream.result(5)
        assert outcome.state == "failed" and "restarted" in (outcome.reason or "")
        assert runtime.core.index.num_blocks("p1") == 0  # the new process holds none yet
        assert "p1" in runtime.core.prefill and runtime.core.num_in_flight == 0

        # The same process joining again (after a Conductor restart, say) keeps its
        # requests; its index is rebuilt from the blocks it announces.
        assert stub.Heartbeat(_beat("p1", [31, 32]), metadata=secret).acknowledged
        assert stub.Join(new, metadata=secret).accepted
        assert runtime.core.index.num_blocks("p1") == 0
        assert stub.Heartbeat(_beat("p1", [31, 32]), metadata=secret).acknowledged
        assert runtime.core.index.num_blocks("p1") == 2
    finally:
        hung.release.set()
        server.stop(grace=0)


def test_a_restarted_conductor_ends_its_predecessors_open_requests(sessions) -> None:
    """A Conductor that died mid-request left it open in the database: the next one on the
    same database ends it `failed` (conductor_restart) before serving."""
    first = ConductorRuntime(make_settings(), COST, session_factory=sessions)
    try:
        first.submit("done", [1, 2, 3], 2).result(5)  # no agents: refused at admission
        assert first.flush_records()
    finally:
        first.stop()
    with sessions() as session:  # as if the Conductor had died while it ran
        arrival = ev.RequestArrived(5.0, "open", (1,), 64, 8, 1.0, 0.1)
        request_log.record_arrival(session=session, arrival=arrival, block_size=BLOCK)
    second = ConductorRuntime(make_settings(), COST, session_factory=sessions)
    second.stop()
    with sessions() as session:
        ended = request_log.get_request(session=session, request_id="open")
        kept = request_log.get_request(session=session, request_id="done")
    assert (ended.outcome.state, ended.outcome.reason) == ("failed", "conductor_restart")
    assert kept.outcome.state == "rejected"


def test_a_measurement_that_cannot_be_right_is_dropped_and_the_heartbeat_kept(conductor) -> None:
    """An agent's bad measurement (a bug, another version) must not poison the calibration's
    fit, nor cost the heartbeat that carries it: its liveness and KV events still count."""
    runtime, clock, stub = conductor
    secret = call_metadata(SECRET)
    assert stub.Join(_join("p1", pb.PREFILL), metadata=secret).accepted
    beat = _beat("p1", [41, 42])
    sound = dict(input_tokens=300, cached_tokens=100, seconds=0.05, age_s=0.2, cpu_s=0.04)
    beat.prefill_samples.extend(
        [
            pb.PrefillSample(**sound),
            pb.PrefillSample(**{**sound, "seconds": -0.05}),
            pb.PrefillSample(**{**sound, "cached_tokens": 400}),  # more cached than input
            pb.PrefillSample(**{**sound, "cpu_s": float("nan")}),
        ]
    )
    beat.decode_steps.extend(
        [
            pb.DecodeStepSample(batch_size=4, context_tokens=900, seconds=0.02, age_s=0.1),
            pb.DecodeStepSample(batch_size=0, context_tokens=900, seconds=0.02, age_s=0.1),
            pb.DecodeStepSample(batch_size=4, context_tokens=900, seconds=float("inf")),
        ]
    )
    beat.host_cpu.CopyFrom(pb.HostCpuSample(host_id="boot-1", cpus=2, busy_s=9.0, total_s=8.0))
    clock.now_s += 1.0
    assert stub.Heartbeat(beat, metadata=secret).acknowledged
    assert runtime.core.index.prefix_blocks((41, 42), ["p1"]) == {"p1": 2}  # its KV events
    calibrator = runtime.calibrator
    assert [(s.input_tokens, s.cached_tokens, s.seconds) for s in calibrator.prefill] == [
        (300, 100, 0.05)
    ]
    assert [(s.batch_size, s.seconds) for s in calibrator.decode] == [(4, 0.02)]
    assert list(calibrator.host_cpu) == []
    beat.host_cpu.busy_s = 5.0  # a sound reading is taken
    beat.ClearField("prefill_samples")
    beat.ClearField("decode_steps")
    beat.sequence = 2
    assert stub.Heartbeat(beat, metadata=secret).acknowledged
    assert [s.busy_s for s in calibrator.host_cpu] == [5.0]
