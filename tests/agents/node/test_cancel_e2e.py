"""Cancel on real agent processes: a request is dropped wherever it stands (a dispatch that
comes after its cancel, KV handed off but not yet decoded, the decode batch), and a decode
whose caller goes away (a cancelled call, as when the Conductor dies) frees its slot."""

import time

import grpc
import pytest

from backend.rpc import agent_pb2 as pb
from tests.harness.agents import AgentProcess, prefill_request, stop_agents, wait_all

SECRET = "test-secret-cancel-0123"
LONG = 20_000  # output tokens: far more than a test waits for (40 MB of tiny KV)


@pytest.fixture(scope="module")
def pair():
    agents = wait_all([AgentProcess("prefill", SECRET), AgentProcess("decode", SECRET)])
    yield agents
    stop_agents(agents)


def _tokens(start: int) -> list[int]:
    return list(range(start, start + 150))


def _decode_request(request_id: str, tokens: list[int], first_token: int, max_tokens: int):
    return pb.DispatchDecodeRequest(
        request_id=request_id,
        num_context_tokens=len(tokens),
        first_token=first_token,
        max_tokens=max_tokens,
    )


def _batch_size(agent: AgentProcess) -> int:
    return agent.stub.GetState(pb.GetStateRequest()).decode.batch_size


def _wait_for_batch(agent: AgentProcess, size: int, timeout_s: float) -> float:
    """Seconds until the agent's decode batch has `size` requests; fails after timeout_s."""
    started_s = time.monotonic()
    while (batch := _batch_size(agent)) != size:
        assert time.monotonic() - started_s < timeout_s, f"batch still {batch} after {timeout_s} s"
        time.sleep(0.02)
    return time.monotonic() - started_s


def test_a_dispatch_after_its_cancel_is_refused(pair) -> None:
    prefill, _decode = pair
    reply = prefill.stub.Cancel(pb.CancelRequest(request_id="late", reason="client_disconnected"))
    assert reply.dropped_from == ""  # it had not reached the agent
    with pytest.raises(grpc.RpcError) as refused:
        prefill.stub.DispatchPrefill(prefill_request("late", _tokens(0)))
    assert refused.value.code() == grpc.StatusCode.CANCELLED
    assert "client_disconnected" in refused.value.details()


def test_handed_off_kv_is_dropped_and_its_decode_refused(pair) -> None:
    prefill, decode = pair
    tokens = _tokens(1000)
    request = prefill_request("handed", tokens, decode_address=decode.data_address)
    first = prefill.stub.DispatchPrefill(request).first_token
    reply = decode.stub.Cancel(pb.CancelRequest(request_id="handed", reason="deadline"))
    assert reply.dropped_from == "handoff"
    with pytest.raises(grpc.RpcError) as refused:
        next(iter(decode.stub.DispatchDecode(_decode_request("handed", tokens, first, 8))))
    assert refused.value.code() == grpc.StatusCode.CANCELLED


def test_cancel_takes_a_request_out_of_the_decode_batch(pair) -> None:
    prefill, decode = pair
    tokens = _tokens(2000)
    request = prefill_request("decoding", tokens, decode_address=decode.data_address)
    first = prefill.stub.DispatchPrefill(request).first_token
    messages = iter(decode.stub.DispatchDecode(_decode_request("decoding", tokens, first, LONG)))
    for _ in range(3):
        assert not next(messages).done
    assert _batch_size(decode) == 1
    reply = decode.stub.Cancel(pb.CancelRequest(request_id="decoding", reason="stop_sequence"))
    assert reply.dropped_from == "decode"
    last = next(message for message in messages if message.done)
    assert (last.status, last.reason) == ("cancelled", "stop_sequence")
    assert _batch_size(decode) == 0


def test_a_decode_whose_caller_cancels_the_call_frees_its_slot_within_a_second(pair) -> None:
    """What happens to a dead Conductor's decodes: its connection closing ends the calls."""
    prefill, decode = pair
    tokens = _tokens(3000)
    request = prefill_request("abandoned", tokens, decode_address=decode.data_address)
    first = prefill.stub.DispatchPrefill(request).first_token
    call = decode.stub.DispatchDecode(_decode_request("abandoned", tokens, first, LONG))
    for _ in range(3):
        next(call)
    assert _batch_size(decode) == 1
    call.cancel()
    assert _wait_for_batch(decode, 0, timeout_s=1.0) < 1.0
