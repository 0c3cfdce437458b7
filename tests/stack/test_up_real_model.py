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

from backend.cli.children import free_port
from backend.tokenizer.model_tokenizer import ModelTokenizer
from tests.harness.reference_model import (
    MODEL,
    load_reference,
    load_tokenizer,
    needs_real_model,
    reference_greedy,
)

KVCENTRIC = str(Path(sys.executable).parent / "kvcentric")
pytestmark = needs_real_model
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    "]
NUM_TOKENS = 16


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    data = tmp_path_factory.mktemp("up")
    port = free_port()
    args = [
        KVCENTRIC, "up", "--model", MODEL, "--prefill", "1", "--decode", "1", "--no-replay",
        "--no-console", "--data-dir", str(data), "--port", str(port),
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
