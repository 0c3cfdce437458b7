"""Reused prefixes end to end over real agent processes: loaded from the own shard, fetched
from a peer over each transport, and fetched corrupt (then recomputed).

Every warm prefill must give the first token and logits of a cold single-process prefill.
The faulty holder runs with the test-only KVC_FAULT_CORRUPT_FETCH=1 (agents/node/faults.py).
"""

import numpy as np
import pytest
import torch

from agents.model import build_model
from agents.node.faults import CORRUPT_FETCH_ENV
from agents.transport.mooncake_engine import mooncake_missing_reason
from backend.policy.blocks import block_keys
from backend.policy.effects import CachePlan, FetchSpan
from backend.rpc import agent_pb2 as pb
from tests.harness.agents import AgentProcess, prefill_request, stop_agents, wait_all

BLOCK = 64
SECRET = "test-secret-0123456789"
NUM_SHARED_BLOCKS = 3


@pytest.fixture(scope="module")
def model():
    return build_model("tiny", seed=0, device="cpu")


@pytest.fixture(scope="module")
def tcp_agents():
    """Holder, requester and a holder that serves corrupt blocks, all on tcp."""
    agents = wait_all(
        [
            AgentProcess("prefill", SECRET),
            AgentProcess("prefill", SECRET),
            AgentProcess("prefill", SECRET, env={CORRUPT_FETCH_ENV: "1"}),
        ]
    )
    yield agents
    stop_agents(agents)


@pytest.fixture(scope="module")
def mooncake_agents():
    if reason := mooncake_missing_reason():
        pytest.skip(reason)
    agents = wait_all([AgentProcess("prefill", SECRET, "--transport", "mooncake") for _ in "ab"])
    yield agents
    stop_agents(agents)  # the engines take about a second each to tear down, in parallel


@pytest.fixture(params=["tcp", "mooncake"])
def holder_and_requester(request) -> tuple[AgentProcess, AgentProcess]:
    holder, requester, *_ = request.getfixturevalue(f"{request.param}_agents")
    return holder, requester


def _prompts(seed: int) -> tuple[list[int], list[int]]:
    """Two prompts sharing NUM_SHARED_BLOCKS full blocks, then different tails."""
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, 32_000, NUM_SHARED_BLOCKS * BLOCK).tolist()
    return shared + rng.integers(0, 32_000, 10).tolist(), shared + rng.integers(
        0, 32_000, 20
    ).tolist()


def _assert_matches_cold_prefill(reply: pb.DispatchPrefillReply, model, tokens: list[int]) -> None:
    reference, _ = model.full_prefill(torch.tensor(tokens))
    assert reply.first_token == int(torch.argmax(reference))
    assert torch.allclose(torch.tensor(reply.logits), reference, atol=1e-4)


def _prime(holder: AgentProcess, request_id: str, tokens: list[int]) -> None:
    cold = holder.stub.DispatchPrefill(prefill_request(request_id, tokens))
    assert cold.num_reused_tokens == 0
    assert list(cold.stored_keys) == block_keys(tokens, BLOCK)


def test_prefix_loaded_from_the_local_shard_matches_cold_prefill(tcp_agents, model) -> None:
    _, agent, _ = tcp_agents
    first, second = _prompts(10)
    keys = block_keys(second, BLOCK)[:NUM_SHARED_BLOCKS]
    _prime(agent, "local-1", first)
    plan = CachePlan(tuple(keys), None, NUM_SHARED_BLOCKS * BLOCK, 20)
    warm = agent.stub.DispatchPrefill(prefill_request("local-2", second, plan))
    assert warm.num_reused_tokens == NUM_SHARED_BLOCKS * BLOCK
    assert warm.num_fetched_tokens == 0 and not warm.recomputed_keys
    _assert_matches_cold_prefill(warm, model, second)


def test_prefix_fetched_from_a_peer_matches_cold_prefill(holder_and_requester, model) -> None:
    holder, requester = holder_and_requester
    first, second = _prompts(20)
    keys = block_keys(second, BLOCK)[:NUM_SHARED_BLOCKS]
    _prime(holder, "fetch-1", first)
    plan = CachePlan((), FetchSpan(holder.instance_id, tuple(keys)), len(keys) * BLOCK, 20)
    addresses = {holder.instance_id: holder.data_address}
    warm = requester.stub.DispatchPrefill(prefill_request("fetch-2", second, plan, addresses))
    assert warm.num_fetched_tokens == warm.num_reused_tokens == NUM_SHARED_BLOCKS * BLOCK
    assert not warm.recomputed_keys
    _assert_matches_cold_prefill(warm, model, second)


def test_corrupt_fetched_block_is_recomputed_and_agents_keep_serving(tcp_agents, model) -> None:
    _, requester, faulty = tcp_agents
    first, second = _prompts(30)
    keys = block_keys(second, BLOCK)[:NUM_SHARED_BLOCKS]
    _prime(faulty, "corrupt-1", first)
    plan = CachePlan((), FetchSpan(faulty.instance_id, tuple(keys)), len(keys) * BLOCK, 20)
    request = prefill_request(
        "corrupt-2", second, plan, {faulty.instance_id: faulty.data_address}, replicate=True
    )
    warm = requester.stub.DispatchPrefill(request)
    assert list(warm.recomputed_keys) == keys[-1:]  # the faulty holder damages the last block
    assert warm.num_fetched_tokens == warm.num_reused_tokens == (NUM_SHARED_BLOCKS - 1) * BLOCK
    _assert_matches_cold_prefill(warm, model, second)
    assert set(block_keys(second, BLOCK)) <= set(warm.stored_keys)  # recomputed, then stored

    again = requester.stub.DispatchPrefill(
        prefill_request("corrupt-3", second, CachePlan(tuple(keys), None, len(keys) * BLOCK, 20))
    )
    assert again.num_reused_tokens == NUM_SHARED_BLOCKS * BLOCK and not again.recomputed_keys
    _assert_matches_cold_prefill(again, model, second)
    assert faulty.stub.GetState(pb.GetStateRequest()).memory.num_dram_blocks >= len(keys)


def test_fetch_from_an_unreachable_holder_is_recomputed(tcp_agents, model) -> None:
    _, requester, _ = tcp_agents
    _, second = _prompts(40)
    keys = tuple(block_keys(second, BLOCK)[:NUM_SHARED_BLOCKS])
    plan = CachePlan((), FetchSpan("gone", keys), len(keys) * BLOCK, 20)
    addresses = {"gone": "127.0.0.1:1"}  # nothing listens there
    warm = requester.stub.DispatchPrefill(prefill_request("gone-1", second, plan, addresses))
    assert list(warm.recomputed_keys) == list(keys) and warm.num_reused_tokens == 0
    _assert_matches_cold_prefill(warm, model, second)
