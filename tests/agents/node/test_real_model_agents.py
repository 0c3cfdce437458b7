"""The real model across agent processes: a prefix fetched over the data plane from another
prefill agent, the prompt's KV handed to a decode agent, 32 greedy tokens equal to
transformers' on the same file."""

import pytest

from backend.policy.blocks import block_keys
from backend.policy.effects import CachePlan, DispatchPrefill, FetchSpan
from backend.rpc import agent_pb2 as pb
from backend.rpc.convert import dispatch_prefill_to_proto
from tests.harness.agents import AgentProcess, wait_all
from tests.harness.reference_model import (
    MODEL,
    load_reference,
    load_tokenizer,
    needs_real_model,
    reference_greedy,
)

pytestmark = needs_real_model
BLOCK = 16
SECRET = "test-secret-0123456789"
NUM_TOKENS = 32
SYSTEM = (
    "<|im_start|>system\nYou are a patient teacher. You answer in plain words, one idea at "
    "a time, and you check that the student follows.<|im_end|>\n"
)


@pytest.fixture(scope="module")
def cluster():
    agents = wait_all(
        [
            AgentProcess(role, SECRET, block_size=BLOCK, model=MODEL)
            for role in ("prefill", "prefill", "decode")
        ]
    )
    yield agents
    for agent in agents:
        agent.terminate()


def test_a_fetched_prefix_and_a_handoff_give_transformers_tokens(cluster):
    tokenizer = load_tokenizer()
    a, b, d = cluster
    first = tokenizer.encode(SYSTEM + "<|im_start|>user\nWhat is rain?<|im_end|>\n")
    prompt = tokenizer.encode(
        SYSTEM + "<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>assistant\n"
    )
    shared = next(i for i, (x, y) in enumerate(zip(first, prompt, strict=False)) if x != y)
    num_shared_blocks = shared // BLOCK
    assert num_shared_blocks >= 2
    cold = DispatchPrefill(
        "r1", a.instance_id, "", CachePlan((), None, 0, len(first)), 0, 0, 0, 0, ()
    )
    a.stub.DispatchPrefill(dispatch_prefill_to_proto(cold, first, {}, replicate=False))
    keys = tuple(block_keys(prompt, BLOCK)[:num_shared_blocks])
    plan = CachePlan(
        (), FetchSpan(a.instance_id, keys), num_shared_blocks * BLOCK, len(prompt) - shared
    )
    warm = DispatchPrefill("r2", b.instance_id, "d", plan, 0, 0, 0, 0, ())
    addresses = {a.instance_id: a.data_address, "d": d.data_address}
    reply = b.stub.DispatchPrefill(
        dispatch_prefill_to_proto(warm, prompt, addresses, replicate=False)
    )
    assert reply.num_fetched_tokens == num_shared_blocks * BLOCK and reply.handed_off
    stream = d.stub.DispatchDecode(
        pb.DispatchDecodeRequest(
            request_id="r2",
            num_context_tokens=len(prompt),
            first_token=reply.first_token,
            max_tokens=NUM_TOKENS,
            sampling=pb.Sampling(ignore_eos=True),
        )
    )
    tokens = [message.token for message in stream if not message.done]
    assert tokens == reference_greedy(load_reference(), prompt, NUM_TOKENS)
