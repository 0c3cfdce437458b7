"""The real model through the whole stack: SmolLM2-135M on a prefill and a decode agent
process, the prompt's KV handed over the data plane, the REST API tokenizing with the
model's own tokenizer and chat template; outputs equal transformers' greedy ones."""

import httpx
import openai
import pytest

from backend.tokenizer.model_tokenizer import ModelTokenizer
from tests.harness.reference_model import (
    MODEL,
    load_reference,
    load_tokenizer,
    needs_real_model,
    reference_greedy,
)
from tests.harness.stack import runtime_stack
from tests.runtime.conftest import COST, make_settings

pytestmark = needs_real_model
API_KEY = "api-key-0123456789"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
NUM_TOKENS = 32
QUESTIONS = ["What is the capital of France?", "Name three colours of the rainbow."]


@pytest.fixture(scope="module")
def stack():
    # The test's own reference shares the cores with both agents: a heartbeat can be late.
    settings = make_settings(served_model=MODEL, calibrate=False, heartbeat_timeout_s=20.0)
    with runtime_stack(settings, ["prefill", "decode"], COST, model=MODEL) as running:
        yield running


@pytest.fixture(scope="module")
def tokenizer() -> ModelTokenizer:
    return load_tokenizer()


@pytest.fixture(scope="module")
def reference():
    return load_reference()


def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=API_KEY, max_retries=0)


@pytest.mark.parametrize("question", QUESTIONS)
def test_a_chat_answer_is_transformers_greedy_answer_stopped_at_the_end_token(
    stack, tokenizer, reference, question
):
    messages = [{"role": "user", "content": question}]
    prompt = tokenizer.encode(tokenizer.chat_prompt([("user", question)]))
    expected = reference_greedy(reference, prompt, 64, stop_token_id=tokenizer.eos_token_id)
    reply = client(stack).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=64, temperature=0
    )
    assert reply.choices[0].message.content == tokenizer.decode(expected)
    assert reply.usage is not None and reply.usage.prompt_tokens == len(prompt)
    if expected[-1] == tokenizer.eos_token_id:
        assert reply.choices[0].finish_reason == "stop"
        assert reply.usage.completion_tokens == len(expected)
    streamed = client(stack).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=64, temperature=0, stream=True
    )
    pieces = [chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices]
    assert "".join(pieces) == reply.choices[0].message.content


def test_32_tokens_past_the_end_token_and_again_on_the_reused_prefix(stack, tokenizer, reference):
    """ignore_eos: 32 tokens to compare token for token; the second request of the same
    prompt reuses its prefix blocks on the prefill agent."""
    question = (
        "Paris is the capital and largest city of France. It lies on the Seine, in the north "
        "of the country, at the heart of the Ile-de-France region. Its museums, its cafes and "
        "its long history draw millions of visitors each year. Which river flows through it?"
    )
    prompt = tokenizer.encode(tokenizer.chat_prompt([("user", question)]))
    assert len(prompt) > 64, "the prompt must fill a 64-token block to reuse"
    expected = reference_greedy(reference, prompt, NUM_TOKENS)
    body = {
        "model": MODEL,
        "token_ids": prompt,
        "max_tokens": NUM_TOKENS,
        "ignore_eos": True,
        "temperature": 0,
    }
    for _ in range(2):
        answer = httpx.post(f"{stack.url}/v1/native/requests", json=body, headers=AUTH, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["output"]["token_ids"] == expected
    assert len(stack.runtime.core.index) > 0  # the prompt's full blocks, reused the second time


def test_the_api_names_the_real_model_and_tokenizes_with_it(stack, tokenizer):
    assert client(stack).models.list().data[0].id == MODEL
    reply = client(stack).completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=3, temperature=0
    )
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(tokenizer.encode("The capital of France is"))
    assert reply.choices[0].text.startswith(" Paris")
