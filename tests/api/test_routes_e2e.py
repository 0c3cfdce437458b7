"""The REST routes over a real runtime and real agent processes (2 prefill + 1 decode, tiny
preset), served by uvicorn on a loopback port and called through the official openai client
and httpx."""

import random
from collections import Counter
from concurrent import futures

import httpx
import openai
import pytest

from tests.harness.stack import runtime_stack
from tests.runtime.conftest import COST, make_settings

API_KEY = "api-key-0123456789"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def served():
    with runtime_stack(make_settings(), ["prefill", "prefill", "decode"], COST) as stack:
        yield stack.url, stack.app


def test_a_streamed_completion_through_the_openai_client(served):
    url, app = served
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0)
    chunks = list(
        client.completions.create(
            model="tiny", prompt="the quick brown fox jumps over", max_tokens=5, stream=True
        )
    )
    texts = [chunk.choices[0].text for chunk in chunks if chunk.choices]
    assert len([text for text in texts if text]) == 5
    assert chunks[-1].choices[0].finish_reason == "length"
    assert client.models.list().data[0].id == "tiny"
    metrics = app.state.metrics.render().decode()
    assert 'kvcentric_requests_accepted_total{endpoint="completions"} 1.0' in metrics
    # The runtime records its decisions in the same registry.
    assert "kvcentric_decisions_total{" in metrics
    assert "kvcentric_input_tokens_total 0.0" not in metrics


def test_a_chat_completion_and_its_record(served):
    url, _ = served
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0)
    reply = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello there"}], max_tokens=4
    )
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens == 4
    record = httpx.get(f"{url}/v1/requests/{reply.id}", headers=AUTH).json()
    assert record["state"] == "completed" and record["num_generated_tokens"] == 4
    assert record["decision"]["prefill_instance_id"]
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) == 3
    assert chunks[-1].choices[0].finish_reason == "length"


def test_log_probabilities_come_with_every_token_when_asked(served):
    """Through real agents (the prefill answers the first token's, decode the rest): one
    entry per generated token, the sampled one's log-probability and the alternatives asked
    for; none when not asked. (tests/stack/test_up_real_model.py checks the values against
    transformers on the real model.)"""
    url, _ = served
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0)
    whole = client.completions.create(
        model="tiny", prompt="the quick brown fox", max_tokens=4, temperature=0, logprobs=2
    )
    logprobs = whole.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 4
    assert "".join(logprobs.tokens) == whole.choices[0].text
    assert logprobs.text_offset == [sum(map(len, logprobs.tokens[:i])) for i in range(4)]
    for value, top in zip(logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert len(top) == 2 and value == pytest.approx(max(top.values())) and value <= 0
    plain = client.completions.create(model="tiny", prompt="the quick brown fox", max_tokens=2)
    assert plain.choices[0].logprobs is None

    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=3,
            temperature=0,
            logprobs=True,
            stream=True,
        )
    )
    content = [
        entry
        for chunk in chunks
        if chunk.choices and chunk.choices[0].logprobs is not None
        for entry in chunk.choices[0].logprobs.content
    ]
    assert len(content) == 3 and all(entry.top_logprobs == [] for entry in content)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert b"".join(bytes(entry.bytes) for entry in content).decode() == text


def test_echo_puts_the_prompt_before_the_completion(served):
    url, _ = served
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0)
    prompt = "the quick brown fox"
    plain = client.completions.create(model="tiny", prompt=prompt, max_tokens=3, temperature=0)
    echoed = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=3, temperature=0, echo=True
    )
    assert echoed.choices[0].text == prompt + plain.choices[0].text
    chunks = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=3, temperature=0, echo=True, stream=True
    )
    texts = [chunk.choices[0].text for chunk in chunks if chunk.choices]
    assert texts[0] == prompt and "".join(texts) == echoed.choices[0].text
    refused = httpx.post(
        f"{url}/v1/completions",
        json={"model": "tiny", "prompt": prompt, "echo": True, "logprobs": 1},
        headers=AUTH,
    )
    assert refused.status_code == 422 and "echo with logprobs" in refused.text


def test_native_token_ids_stream_as_sse_ending_with_done(served):
    url, _ = served
    body = {"token_ids": list(range(1, 80)), "max_tokens": 3, "stream": True}
    with httpx.stream("POST", f"{url}/v1/native/requests", json=body, headers=AUTH) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert len(lines) == 3 + 1 + 1  # one per token, the finish chunk, [DONE]


def test_submission_without_a_key_is_401(served):
    url, _ = served
    response = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": "hi"})
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "missing_credentials"


def test_an_early_rejection_is_429_with_reason_stage_and_retry_after(served):
    url, _ = served
    body = {"token_ids": list(range(1, 2000)), "max_tokens": 2, "ttft_slo_s": 1e-6}
    response = httpx.post(f"{url}/v1/native/requests", json=body, headers=AUTH)
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["stage"] == "admission" and error["reason"]
    assert int(response.headers["Retry-After"]) >= 1


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"{not json", 400),
        (b'{"model": "tiny"}', 422),  # no prompt
        (b'{"model": "tiny", "prompt": "hi", "max_tokens": 0}', 422),
        (b'{"model": "nope", "prompt": "hi"}', 404),
        (b'{"model": "tiny", "prompt": "hi", "max_tokens": 5000}', 400),
        (b'{"model": "tiny", "prompt": "hi", "max_tokens": 1000000000}', 400),  # one limit
        (b'{"model": "tiny", "prompt": [1, 99999]}', 400),
    ],
)
def test_malformed_bodies_are_4xx_with_a_message(served, body, status):
    url, _ = served
    headers = {**AUTH, "Content-Type": "application/json"}
    response = httpx.post(f"{url}/v1/completions", content=body, headers=headers)
    assert response.status_code == status, response.text
    assert response.json()["error"]["message"]


def test_under_overload_excess_requests_get_429_while_accepted_ones_complete(served):
    url, app = served
    runtime = app.state.served.runtime
    rng = random.Random(7)

    def post(i: int) -> httpx.Response:
        # Predicted 0.41 s each (COST); two fit an instance's 1.0 s SLO at once. Long prompts
        # keep the real prefills (~0.1 s) slower than the burst arrives, so the queue the
        # core predicts builds up whatever the machine's speed.
        body = {
            "token_ids": [rng.randrange(1, 32_000) for _ in range(4000)],
            "max_tokens": 3,
            "ttft_slo_s": 1.0,
        }
        return httpx.post(f"{url}/v1/native/requests", json=body, headers=AUTH, timeout=120)

    with futures.ThreadPoolExecutor(24) as pool:
        replies = list(pool.map(post, range(24)))

    statuses = Counter(r.status_code for r in replies)
    assert set(statuses) == {200, 429} and statuses[200] >= 2, statuses
    for reply in replies:
        if reply.status_code == 429:
            error = reply.json()["error"]
            assert (error["stage"], error["reason"]) == ("admission", "ttft_slo")
        else:
            body = reply.json()
            outcome = runtime.request(body["id"]).result(30)
            assert outcome.state == "completed" and outcome.num_generated_tokens == 3


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_sequence_cuts_the_text_and_finishes_with_stop(served, stream):
    url, _ = served
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0)
    asked = {"model": "tiny", "prompt": "one two three four", "max_tokens": 8, "temperature": 0}
    full = client.completions.create(**asked).choices[0].text
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    expected = full[: full.find(stop)]
    if stream:
        chunks = list(client.completions.create(**asked, stop=[stop], stream=True))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        reason = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    else:
        choice = client.completions.create(**asked, stop=[stop]).choices[0]
        text, reason = choice.text, choice.finish_reason
    assert (text, reason) == (expected, "stop")


def test_what_openai_clients_send_by_default_is_honoured_or_clearly_refused(served):
    """Gaps found with the official client: one model's card, its creation time, the
    developer role, response_format text and an empty tool list; JSON output and real tools
    get a 4xx that says what is not supported."""
    url, _ = served
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0)
    card = client.models.retrieve("tiny")
    assert card.id == "tiny" and card.created > 0
    assert client.models.list().data[0].created == card.created
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.models.retrieve("gpt-4")
    reply = client.chat.completions.create(
        model="tiny",
        messages=[
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": "hi"},
        ],
        max_tokens=2,
        response_format={"type": "text"},
        tools=[],
        tool_choice="none",
    )
    assert reply.choices[0].message.content
    with pytest.raises(openai.UnprocessableEntityError, match="only 'text'"):
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_object"},
        )
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    with pytest.raises(openai.UnprocessableEntityError, match="tools are not supported"):
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], tools=[tool]
        )


def test_the_api_docs_page_loads_its_assets_from_the_server(served):
    url, _ = served
    page = httpx.get(f"{url}/docs")
    assert page.status_code == 200 and "/docs-assets/swagger-ui-bundle.js" in page.text
    assert "cdn" not in page.text.lower()
    script = httpx.get(f"{url}/docs-assets/swagger-ui-bundle.js")
    assert script.status_code == 200 and len(script.content) > 100_000
