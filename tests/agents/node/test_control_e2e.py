"""The control calls end to end over real agent processes: the decode agent's local TBT
check, ReplicateBlocks, SetRole after a drain, and Drain waiting for in-flight calls."""

import json
import time

import grpc
import pytest

from backend.policy.blocks import block_keys
from backend.policy.cost_model import CostModel
from backend.rpc import agent_pb2 as pb
from backend.rpc.convert import kv_events_from_proto
from tests.harness.agents import AgentProcess, prefill_request, stop_agents, wait_all

BLOCK = 64
SECRET = "test-secret-0123456789"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A prefill agent, one to replicate into and switch, a decode agent to drain, and a
    decode agent whose TBT SLO (1 ns on a 70B cost model) every request misses."""
    profile = tmp_path_factory.mktemp("profile") / "70b.json"
    profile.write_text(json.dumps(CostModel.reference_70b().to_profile()))
    agents = wait_all(
        [
            AgentProcess("prefill", SECRET),
            AgentProcess("prefill", SECRET),
            AgentProcess("decode", SECRET),
            AgentProcess("decode", SECRET, "--profile", str(profile), "--tbt-slo", "1e-9"),
        ]
    )
    yield agents
    stop_agents(agents)


def _prompt(start: int, num_tokens: int = 2 * BLOCK + 7) -> list[int]:
    return list(range(start, start + num_tokens))


def _hand_off(prefill: AgentProcess, decode: AgentProcess, request_id: str, tokens) -> int:
    """Prefill `tokens` and push their KV to `decode`; the first token."""
    request = prefill_request(request_id, tokens, decode_address=decode.data_address)
    reply = prefill.stub.DispatchPrefill(request)
    assert reply.handed_off
    return reply.first_token


def _decode(agent: AgentProcess, request_id: str, tokens, first_token: int, max_tokens: int):
    request = pb.DispatchDecodeRequest(
        request_id=request_id,
        num_context_tokens=len(tokens),
        first_token=first_token,
        max_tokens=max_tokens,
    )
    return agent.stub.DispatchDecode(request)


def test_decode_over_the_tbt_slo_is_rejected_with_a_reason(cluster) -> None:
    prefill, _, _, strict = cluster
    for request_id in ("tbt-1", "tbt-2"):  # the agent keeps serving after a rejection
        tokens = _prompt(100 + len(request_id))
        first = _hand_off(prefill, strict, request_id, tokens)
        messages = list(_decode(strict, request_id, tokens, first, 4))
        assert [(m.done, m.status, m.reason, m.stage) for m in messages] == [
            (True, "rejected", "tbt_slo", "decode")
        ]
    state = strict.stub.GetState(pb.GetStateRequest())
    assert state.decode.batch_size == 0 and state.memory.num_pending_handoffs == 0
    assert state.decode.tbt_slo_s == pytest.approx(1e-9)


def test_replicate_blocks_stores_them_and_names_what_failed(cluster) -> None:
    holder, target, _, _ = cluster
    tokens = _prompt(300)
    holder.stub.DispatchPrefill(prefill_request("rep-1", tokens))
    keys = block_keys(tokens, BLOCK)
    before = target.stub.GetState(pb.GetStateRequest()).memory.num_dram_blocks
    reply = target.stub.ReplicateBlocks(
        pb.ReplicateBlocksRequest(source_data_address=holder.data_address, keys=keys)
    )
    assert list(reply.stored_keys) == keys and not reply.failed_keys and not reply.error
    assert [event.keys for event in kv_events_from_proto(reply.events)] == [tuple(keys)]
    after = target.stub.GetState(pb.GetStateRequest()).memory.num_dram_blocks
    assert after == before + len(keys)

    missing = pb.ReplicateBlocksRequest(source_data_address=holder.data_address, keys=[12345])
    reply = target.stub.ReplicateBlocks(missing)
    assert list(reply.failed_keys) == [12345] and not reply.stored_keys
    assert f"{12345:#x}" in reply.error


def test_set_role_after_drain_turns_a_prefill_agent_into_a_decode_agent(cluster) -> None:
    prefill, switching, _, _ = cluster
    assert switching.stub.Drain(pb.DrainRequest(timeout_s=5)).drained
    assert switching.stub.SetRole(pb.SetRoleRequest(role=pb.DECODE)).role == pb.DECODE
    state = switching.stub.GetState(pb.GetStateRequest())
    assert state.role == pb.DECODE and not state.draining

    tokens = _prompt(500)
    with pytest.raises(grpc.RpcError) as error:
        switching.stub.DispatchPrefill(prefill_request("role-0", tokens))
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    first = _hand_off(prefill, switching, "role-1", tokens)
    messages = list(_decode(switching, "role-1", tokens, first, 3))
    assert messages[0].token == first
    assert len(messages) == 4 and messages[-1].status == "completed"

    with pytest.raises(grpc.RpcError) as error:
        switching.stub.SetRole(pb.SetRoleRequest(role=pb.ROLE_UNSPECIFIED))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_drain_waits_for_in_flight_calls_and_refuses_new_ones(cluster) -> None:
    prefill, _, decode, _ = cluster
    tokens = _prompt(700)
    first = _hand_off(prefill, decode, "drain-1", tokens)
    stream = _decode(decode, "drain-1", tokens, first, 300)
    assert next(stream).token == first  # the call is in flight now

    busy = decode.stub.Drain(pb.DrainRequest(timeout_s=0.05))
    assert (busy.drained, busy.num_in_flight) == (False, 1)
    with pytest.raises(grpc.RpcError) as error:
        list(_decode(decode, "drain-2", tokens, first, 2))
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "draining" in error.value.details()

    rest = list(stream)
    assert len(rest) == 300 and rest[-1].done and rest[-1].status == "completed"
    idle = decode.stub.Drain(pb.DrainRequest(timeout_s=5))
    assert (idle.drained, idle.num_in_flight) == (True, 0)
    assert decode.stub.GetState(pb.GetStateRequest()).draining


def test_an_agent_exits_after_sigterm_even_with_a_call_stuck_past_its_drain() -> None:
    """A decode stream far from its end holds a gRPC thread; SIGTERM drains for the
    configured second, then the agent exits (0) instead of waiting on that thread."""
    prefill, decode = wait_all(
        [AgentProcess("prefill", SECRET), AgentProcess("decode", SECRET, "--drain-timeout-s", "1")]
    )
    try:
        tokens = _prompt(900)
        first = _hand_off(prefill, decode, "stuck-1", tokens)
        stream = _decode(decode, "stuck-1", tokens, first, 1_000_000)
        assert next(stream).token == first
        started_s = time.monotonic()
        assert decode.terminate(timeout_s=20) == 0
        assert time.monotonic() - started_s < 15
        log = "".join(decode.stderr_lines)
        assert "1 call(s) still in flight after drain" in log
    finally:
        stop_agents([prefill, decode])
