"""End to end over real agent processes: 2 prefill + 1 decode agents, tiny preset, loopback.

The reference is a single-process run of the same seeded model.
"""

import itertools
import time

import grpc
import numpy as np
import pytest
import torch

from agents.model import PagedKv, build_model
from agents.workers import DecodeRequest, DecodeWorker
from backend.policy.blocks import block_keys
from backend.policy.effects import CachePlan, DispatchPrefill, FetchSpan
from backend.policy.events import KvEvicted
from backend.rpc import agent_pb2 as pb
from backend.rpc.convert import dispatch_prefill_to_proto, kv_events_from_proto
from tests.harness.agents import AgentProcess, start_agents

BLOCK = 64
SECRET = "test-secret-0123456789"
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def cluster():
    agents = start_agents(["prefill", "prefill", "decode"], SECRET)
    yield agents
    for agent in agents:
        if agent.process.poll() is None:
            agent.terminate()


@pytest.fixture(scope="module")
def model():
    return build_model("tiny", seed=0, device="cpu")


def _prompt(seed: int, shared: np.ndarray, tail: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [*shared.tolist(), *rng.integers(0, 32_000, tail).tolist()]


def _reference(model, tokens: list[int]) -> tuple[torch.Tensor, list[int]]:
    logits, kv = model.full_prefill(torch.tensor(tokens))
    outputs: list[int] = []
    worker = DecodeWorker(model, on_token=lambda _, token, __: outputs.append(token))
    first = int(torch.argmax(logits))
    worker.submit(DecodeRequest("ref", PagedKv.from_layers(kv, BLOCK), first, MAX_TOKENS))
    worker.run_until_idle()
    return logits, outputs


def _dispatch(effect_plan: CachePlan, request_id: str, agent: AgentProcess, tokens, addresses):
    effect = DispatchPrefill(request_id, agent.instance_id, "d", effect_plan, 0, 0, 0, 0, ())
    return dispatch_prefill_to_proto(effect, tokens, addresses, replicate=True, return_logits=True)


def test_fetch_reuse_matches_cold_prefill_and_decode_streams_reference(cluster, model) -> None:
    a, b, d = cluster
    addresses = {a.instance_id: a.data_address, b.instance_id: b.data_address, "d": d.data_address}
    shared = np.random.default_rng(0).integers(0, 32_000, 3 * BLOCK)
    first_prompt, second_prompt = _prompt(1, shared, 10), _prompt(2, shared, 20)
    keys = block_keys(second_prompt, BLOCK)

    cold = a.stub.DispatchPrefill(
        _dispatch(CachePlan((), None, 0, len(first_prompt)), "r1", a, first_prompt, {})
    )
    assert cold.num_reused_tokens == 0
    assert list(cold.stored_keys) == block_keys(first_prompt, BLOCK)
    stored = kv_events_from_proto(cold.events)
    assert stored and stored[0].keys == tuple(cold.stored_keys)

    plan = CachePlan((), FetchSpan(a.instance_id, tuple(keys[:3])), 3 * BLOCK, 20)
    warm = b.stub.DispatchPrefill(_dispatch(plan, "r2", b, second_prompt, addresses))
    assert warm.num_fetched_tokens == 3 * BLOCK and warm.num_reused_tokens == 3 * BLOCK
    assert not warm.recomputed_keys
    assert set(keys[:3]) <= set(warm.stored_keys)  # replicated into B's shard
    reference_logits, reference_tokens = _reference(model, second_prompt)
    assert warm.first_token == int(torch.argmax(reference_logits))
    assert torch.allclose(torch.tensor(warm.logits), reference_logits, atol=1e-4)
    assert warm.handed_off

    stream = d.stub.DispatchDecode(
        pb.DispatchDecodeRequest(
            request_id="r2",
            num_context_tokens=len(second_prompt),
            first_token=warm.first_token,
            max_tokens=MAX_TOKENS,
        )
    )
    before_s = time.monotonic()  # the agents run on this host: Linux's monotonic clock is shared
    messages = list(stream)
    assert [m.token for m in messages if not m.done] == reference_tokens
    assert messages[-1].done and messages[-1].status == "completed"
    # Each token says when the agent produced it (the TBT the Conductor records): in order,
    # one step apart, all within the call.
    stamps = [m.produced_s for m in messages if not m.done]
    assert before_s <= stamps[0] and stamps == sorted(stamps) and stamps[-1] <= time.monotonic()
    assert all(b > a for a, b in itertools.pairwise(stamps))

    state = b.stub.GetState(pb.GetStateRequest(take_events=True))
    assert state.memory.num_dram_blocks == 3 and state.role == pb.PREFILL
    assert kv_events_from_proto(state.events)  # the stores of r2, pulled once
    assert not b.stub.GetState(pb.GetStateRequest(take_events=True)).events


def test_a_local_block_evicted_since_the_plan_is_recomputed_and_reported(cluster) -> None:
    """The Conductor's index lags the shard's evictions by up to a heartbeat: a plan naming a
    block the shard no longer holds prefills anyway (those tokens computed) and tells the
    index the block is gone, instead of failing the request."""
    a, _, _ = cluster
    a.stub.GetState(pb.GetStateRequest(take_events=True))  # drop earlier tests' events
    prompt = list(range(1, 2 * BLOCK + 5))
    keys = block_keys(prompt, BLOCK)
    plan = CachePlan((keys[0],), None, BLOCK, len(prompt) - BLOCK)
    reply = a.stub.DispatchPrefill(_dispatch(plan, "r3", a, prompt, {}))
    assert reply.num_tokens == len(prompt) and reply.num_reused_tokens == 0
    assert list(reply.recomputed_keys) == [keys[0]]
    events = kv_events_from_proto(a.stub.GetState(pb.GetStateRequest(take_events=True)).events)
    assert any(isinstance(e, KvEvicted) and keys[0] in e.keys for e in events), events
    assert keys[0] in reply.stored_keys  # computed now, so stored again


def test_plan_keys_must_be_the_prompt_prefix(cluster) -> None:
    a, _, _ = cluster
    plan = CachePlan((12345,), None, BLOCK, 1)
    with pytest.raises(grpc.RpcError) as error:
        a.stub.DispatchPrefill(_dispatch(plan, "r5", a, list(range(1, 100)), {}))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_decode_without_handoff_is_refused(cluster) -> None:
    _, _, d = cluster
    request = pb.DispatchDecodeRequest(
        request_id="never", num_context_tokens=5, first_token=1, max_tokens=2
    )
    with pytest.raises(grpc.RpcError) as error:
        list(d.stub.DispatchDecode(request))
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "never" in error.value.details()


def test_call_without_the_secret_is_refused(cluster) -> None:
    a, _, _ = cluster
    with pytest.raises(grpc.RpcError) as error:
        a.bare_stub.GetState(pb.GetStateRequest())
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "secret" in error.value.details()


def test_evict_reports_events(cluster) -> None:
    a, _, _ = cluster
    prompt = list(range(7, 7 + BLOCK + 3))
    a.stub.DispatchPrefill(_dispatch(CachePlan((), None, 0, 0), "r6", a, prompt, {}))
    key = block_keys(prompt, BLOCK)[0]
    reply = a.stub.EvictBlocks(pb.EvictBlocksRequest(keys=[key]))
    assert [event.keys for event in kv_events_from_proto(reply.events)] == [(key,)]


def test_sigterm_exits_zero(cluster) -> None:
    _, b, _ = cluster
    assert b.terminate() == 0
