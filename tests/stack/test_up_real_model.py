"""`kvcentric up --model smollm2-135m` serves the real model: the `openai` client's greedy
completions of raw prompts equal transformers' greedy continuations (streamed and not),
and a chat question gets the real answer."""

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import openai
import pytest
import torch

from backend.cli.children import free_port
from backend.tokenizer.model_tokenizer import ModelTokenizer
from tests.harness.reference_model import (
    MODEL,
    load_reference,
    load_tokenizer,
    needs_real_model,
    reference_greedy,
    reference_logprobs,
)

KVCENTRIC = str(Path(sys.executable).parent / "kvcentric")
pytestmark = needs_real_model
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    "]
NUM_TOKENS = 16
# Our fp32 pass against transformers' on the same weights: the logits agree to ~1e-4, and
# a log-softmax adds the difference of two log-sum-exps.
LOGPROB_ATOL = 2e-3


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    data = tmp_path_factory.mktemp("up")
    port = free_port()
    args = [
        KVCENTRIC, "up", "--model", MODEL, "--prefill", "1", "--decode", "1", "--no-replay",
        "--no-console", "--warmup-tokens", "0", "--data-dir", str(data), "--port", str(port),
        "--grpc-port", str(free_port()),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVC_")}
    process = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    lines: list[str] = []
    running = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if "the stack keeps running" in line:
                running.set()
        running.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert running.wait(240) and process.poll() is None, "".join(lines)
        output = "".join(lines)
        assert f"model: {MODEL}; cost model: smollm2-cpu profile" in output, output
        api_key = re.search(r"KVC_API_KEY=(\S+)", output).group(1)
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=api_key)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def tokenizer() -> ModelTokenizer:
    return load_tokenizer()


@pytest.fixture(scope="module")
def reference():
    return load_reference()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_completions_equal_transformers(served, tokenizer, reference, prompt):
    expected = tokenizer.decode(reference_greedy(reference, tokenizer.encode(prompt), NUM_TOKENS))
    whole = served.completions.create(
        model=MODEL, prompt=prompt, max_tokens=NUM_TOKENS, temperature=0
    )
    assert whole.choices[0].text == expected
    streamed = served.completions.create(
        model=MODEL, prompt=prompt, max_tokens=NUM_TOKENS, temperature=0, stream=True
    )
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == expected


def test_a_chat_question_gets_the_real_answer(served):
    reply = served.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=32,
        temperature=0,
    )
    assert "Paris" in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"


def test_log_probabilities_equal_transformers(served, tokenizer, reference):
    """`logprobs` on completions (whole) and chat (streamed) are the model's own: each token's
    log-softmax and its most likely alternatives, as transformers computes them."""
    prompt = tokenizer.encode(PROMPTS[0])
    tokens = reference_greedy(reference, prompt, NUM_TOKENS)
    expected = reference_logprobs(reference, prompt, tokens)
    whole = served.completions.create(
        model=MODEL, prompt=PROMPTS[0], max_tokens=NUM_TOKENS, temperature=0, logprobs=3
    )
    logprobs = whole.choices[0].logprobs
    assert logprobs.tokens == [tokenizer.token_bytes(t).decode() for t in tokens]
    assert "".join(logprobs.tokens) == whole.choices[0].text
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset[-1] == len(
        whole.choices[0].text
    ) - len(logprobs.tokens[-1])
    for step, token in enumerate(tokens):
        assert logprobs.token_logprobs[step] == pytest.approx(
            float(expected[step, token]), abs=LOGPROB_ATOL
        )
        values, ids = torch.topk(expected[step], 3)
        assert list(logprobs.top_logprobs[step]) == [
            tokenizer.token_bytes(int(t)).decode() for t in ids
        ]
        assert list(logprobs.top_logprobs[step].values()) == pytest.approx(
            values.tolist(), abs=LOGPROB_ATOL
        )

    streamed = served.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=12,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        stream=True,
    )
    text, content = "", []
    for chunk in streamed:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            if chunk.choices[0].logprobs is not None:
                content += chunk.choices[0].logprobs.content
    assert len(content) == 12 or content[-1].token == "<|im_end|>"
    assert b"".join(bytes(c.bytes) for c in content).decode().startswith(text)
    for entry in content:  # greedy: the chosen token is the most likely one
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].token == entry.token
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)
        assert entry.top_logprobs[1].logprob <= entry.logprob <= 0
