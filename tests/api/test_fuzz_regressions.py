"""What the REST API fuzz (tests/api/test_fuzz.py) found, one small test each, so a fix stays
fixed without the fuzz happening on the same input again.

The last ones are bugs it found outside the API package, fixed where they live: the policy
configuration's types, the trace export's window, the agents' sampling.
"""

import math
import time

import numpy as np
import pytest
import torch
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from pydantic import ValidationError

from agents.workers.sampling import SamplingParams, sample
from backend.api.app import create_app
from backend.api.routes.admin import attach_database
from backend.api.routes.serving import VOCAB_SIZE, Rejected
from backend.api.schemas import ChatCompletionRequest, CompletionRequest, NativeRequest
from backend.api.schemas.convert import (
    MAX_RETRY_AFTER_S,
    MIN_SAMPLING_TEMPERATURE,
    ApiLimits,
    prepare_chat,
    prepare_completion,
    prepare_native,
    rejection_response,
)
from backend.db.session import create_db_engine, create_session_factory, run_migrations
from backend.policy import Reject
from backend.runtime import ConductorRuntime
from backend.tokenizer import SyntheticTokenizer
from tests.runtime.conftest import BLOCK, COST, make_settings

API_KEY = {"Authorization": "Bearer api-key-0123456789"}
ADMIN_TOKEN = {"Authorization": "Bearer admin-token-0123456789"}
LIMITS = ApiLimits(
    models=("tiny",), max_input_tokens=4096, max_output_tokens=1024, vocab_size=VOCAB_SIZE,
    block_size=BLOCK,
)  # fmt: skip
TOKENIZER = SyntheticTokenizer(VOCAB_SIZE)


@pytest.fixture
def client(tmp_path):
    """An idle conductor (no agents) with its database, called in-process."""
    database_url = f"sqlite:///{tmp_path / 'conductor.db'}"
    run_migrations(database_url)
    engine = create_db_engine(database_url)
    sessions = create_session_factory(engine)
    settings = make_settings(database_url=database_url)
    runtime = ConductorRuntime(
        settings, COST, clock=time.time, session_factory=sessions, grpc_address="127.0.0.1:0"
    ).start()
    app = create_app(settings, runtime=runtime)
    attach_database(app, sessions, now_s=time.time())
    yield TestClient(app, raise_server_exceptions=False)
    runtime.stop()
    engine.dispose()


# An SLO of 5e-324 s (valid: > 0) makes the policy's load, and so its Retry-After hint,
# infinite; math.ceil(inf) raised OverflowError and the rejection became a 500.


@pytest.mark.parametrize(
    ("retry_after_s", "header", "in_body"),
    [
        (math.inf, str(int(MAX_RETRY_AFTER_S)), MAX_RETRY_AFTER_S),
        (1e300, str(int(MAX_RETRY_AFTER_S)), MAX_RETRY_AFTER_S),
        (math.nan, "1", 1.0),
        (2.2, "3", 2.2),
    ],
)
def test_a_rejection_with_any_retry_hint_renders_as_a_429(retry_after_s, header, in_body):
    reject = Reject("req-1", "tbt_slo", "admission", "decode pool overloaded", retry_after_s)
    body, headers = rejection_response(reject)
    assert headers == {"Retry-After": header}
    assert body.error.retry_after_s == in_body
    JSONResponse(body.model_dump(), status_code=429, headers=headers)  # finite: renders
    assert Rejected(reject).headers == {"Retry-After": header}


# A seed past int64 passed the schema, then failed the agent.proto conversion inside the
# runtime: a 503 "request failed" for what is the client's mistake.


@pytest.mark.parametrize("seed", [2**63, -(2**63) - 1, 2**80])
def test_a_seed_outside_int64_is_refused_by_the_schemas(seed):
    with pytest.raises(ValidationError, match="seed"):
        CompletionRequest.model_validate({"model": "tiny", "prompt": "hi", "seed": seed})
    with pytest.raises(ValidationError, match="seed"):
        ChatCompletionRequest.model_validate(
            {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "seed": seed}
        )
    with pytest.raises(ValidationError, match="seed"):
        NativeRequest.model_validate({"text": "hi", "seed": seed})


@pytest.mark.parametrize("seed", [2**63 - 1, -(2**63), -1, 0])
def test_every_int64_seed_is_accepted(seed):
    assert NativeRequest.model_validate({"text": "hi", "seed": seed}).seed == seed


def test_a_seed_outside_int64_is_a_422_naming_the_field(client):
    body = {"model": "tiny", "prompt": "hi", "seed": 2**63}
    response = client.post("/v1/completions", json=body, headers=API_KEY)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == "seed"


# A temperature of 5e-324 (valid: >= 0) reached the agents, whose fp32 logits / temperature
# overflowed: "probability tensor contains inf or nan", the prefill failed, a 503.


@pytest.mark.parametrize("temperature", [5e-324, 1e-40, MIN_SAMPLING_TEMPERATURE / 2])
def test_a_vanishing_temperature_is_served_greedily(temperature):
    native = NativeRequest(text="hi", temperature=temperature)
    completion = CompletionRequest(model="tiny", prompt="hi", temperature=temperature)
    chat = ChatCompletionRequest.model_validate(
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "temperature": temperature,
        }
    )
    assert prepare_native(native, tokenizer=TOKENIZER, limits=LIMITS).temperature == 0.0
    assert prepare_completion(completion, tokenizer=TOKENIZER, limits=LIMITS).temperature == 0.0
    assert prepare_chat(chat, tokenizer=TOKENIZER, limits=LIMITS).temperature == 0.0


@pytest.mark.parametrize("temperature", [MIN_SAMPLING_TEMPERATURE, 0.7, 2.0])
def test_a_real_temperature_is_kept(temperature):
    native = NativeRequest(text="hi", temperature=temperature)
    assert prepare_native(native, tokenizer=TOKENIZER, limits=LIMITS).temperature == temperature


def test_the_agents_sample_at_any_positive_temperature():
    logits = torch.from_numpy(np.random.default_rng(0).normal(0, 30, VOCAB_SIZE)).float()
    params = SamplingParams(temperature=1e-40, seed=1)
    assert sample(logits, params, params.generator()) == int(torch.argmax(logits))


# Starlette's 405 named only the first route at the path: OPTIONS /v1/config said
# `Allow: GET` though PUT /v1/config exists (RFC 9110: Allow lists every method served).


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("OPTIONS", "/v1/config", "GET, PUT"),
        ("DELETE", "/v1/config", "GET, PUT"),
        ("GET", "/v1/completions", "POST"),
        ("POST", "/healthz", "GET"),
        ("PATCH", "/v1/requests/req-1", "GET"),
    ],
)
def test_a_405_allows_every_method_served_at_the_path(client, method, path, allow):
    response = client.request(method, path, headers=API_KEY)
    assert response.status_code == 405
    assert response.headers["Allow"] == allow
    assert response.json()["error"]["message"] == "Method Not Allowed"


# The OpenAPI document left out answers the API gives: 401 on the reads that need a key
# (GET /v1/models, /v1/config, /v1/agents, /v1/audit, ...), and the SSE form of the
# submissions' 200 (text/event-stream, with `stream: true`).


def test_every_operation_that_needs_credentials_documents_401(client):
    document = client.get("/openapi.json").json()
    secured = [
        (method, path, operation)
        for path, item in document["paths"].items()
        for method, operation in item.items()
        if operation.get("security")
    ]
    assert len(secured) > 10
    for method, path, operation in secured:
        assert "401" in operation["responses"], f"{method.upper()} {path}"
    assert document["components"]["schemas"]["ErrorBody"]["required"] == ["error"]


@pytest.mark.parametrize(
    ("path", "chunk"),
    [
        ("/v1/completions", "text_completion"),
        ("/v1/chat/completions", "chat.completion.chunk"),
        ("/v1/native/requests", "request.chunk"),
    ],
)
def test_the_submissions_document_their_event_stream(client, path, chunk):
    document = client.get("/openapi.json").json()
    content = document["paths"][path]["post"]["responses"]["200"]["content"]
    assert set(content) == {"application/json", "text/event-stream"}
    data = content["text/event-stream"]["schema"]["properties"]["data"]
    assert data["if"] == {"const": "[DONE]"}
    chunk_schema, error_schema = data["else"]["contentSchema"]["anyOf"]
    assert chunk_schema["properties"]["object"]["const"] == chunk
    assert "$ref" not in str(chunk_schema)  # an event's schema stands alone
    assert error_schema["required"] == ["error"]


# Outside the API package (fixed there): the policy's config types, export windows, sampling.


def test_exporting_a_huge_window_is_not_a_500(client):
    client.post("/v1/native/requests", json={"text": "hi"}, headers=API_KEY)  # recorded: 503
    window = {"start_s": -1e308, "end_s": 1e308}
    response = client.get("/v1/export/trace", params=window, headers=API_KEY)
    assert response.status_code < 500, response.text


def test_a_float_block_size_is_refused_and_submissions_keep_working(client):
    change = client.put("/v1/config", json={"config": {"block_size": 64.0}}, headers=ADMIN_TOKEN)
    submitted = client.post("/v1/native/requests", json={"text": "hi"}, headers=API_KEY)
    assert (change.status_code, submitted.status_code) == (400, 503), submitted.text


def test_a_float_decode_time_window_is_a_400_and_is_not_saved(client):
    change = {"config": {"decode_time_window": 2.5}}
    response = client.put("/v1/config", json=change, headers=ADMIN_TOKEN)
    assert response.status_code == 400, response.text
    assert client.get("/v1/config", headers=API_KEY).json()["version"] == 1
