"""A fuzz of the REST API from its own OpenAPI document (schemathesis): every operation gets
generated requests, schema-valid and not (schemathesis' coverage and fuzzing phases), and no
answer may be a 5xx. Every answer must also conform to the document: a documented status
code and content type, a body (each SSE event too) and headers that match their schemas, 405
with the right Allow header, and credentials that are really enforced.

Two conductors, each on its own migrated SQLite file: an idle one (no agents: submissions are
rejected at admission and the read endpoints see that traffic) and one with a tiny prefill
and decode agent joined, whose schema-valid submissions are steered to the served model and
small limits so that they run end to end. Examples are derandomized: CI sends the same ones.
"""

import collections
import json
import time
from collections.abc import Iterator

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from backend.api.app import create_app
from backend.api.routes.admin import attach_database
from backend.api.routes.serving import VOCAB_SIZE
from backend.api.schemas.convert import ApiLimits
from backend.db.session import create_db_engine, create_session_factory, run_migrations
from backend.runtime import ConductorRuntime
from tests.harness.agents import AgentProcess, stop_agents, wait_all
from tests.runtime.conftest import BLOCK, COST, SECRET, make_settings

API_KEY = {"Authorization": "Bearer api-key-0123456789"}
ADMIN_TOKEN = {"Authorization": "Bearer admin-token-0123456789"}
SUBMISSIONS = ("/v1/completions", "/v1/chat/completions", "/v1/native/requests")
# The agents' conductor: prompts and answers small enough for a 2-core CI machine.
SMALL = ApiLimits(
    models=("tiny",), max_input_tokens=256, max_output_tokens=4, vocab_size=VOCAB_SIZE,
    block_size=BLOCK,
)  # fmt: skip

CONFIG = schemathesis.Config.from_dict(
    {
        # Credentials are ours to send (below), not values to fuzz: a generated x-api-key next
        # to our Authorization is a 401 for conflicting secrets and would hide the handlers.
        "generation": {"with-security-parameters": False},
        # The document cannot say everything a request must be (exactly one prompt form, a
        # window whose start comes before its end, the served model and configured limits),
        # so a schema-valid request may get 400/404/422 by design: not a failure.
        "checks": {"positive_data_acceptance": {"enabled": False}},
    }
)


def _documenting_app() -> FastAPI:
    """An app whose routes (and so OpenAPI document) are those every conductor serves; its
    runtime is never started: the fuzz sends its requests to the fixtures' apps."""
    document_settings = make_settings()
    return create_app(document_settings, runtime=ConductorRuntime(document_settings, COST))


schema = schemathesis.openapi.from_asgi("/openapi.json", _documenting_app(), config=CONFIG)
FUZZ = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
# (operation, status) -> answers, on the conductor with agents: did the fuzz go deep?
ANSWERED_WITH_AGENTS: collections.Counter[tuple[str, int]] = collections.Counter()


def _conductor(base_dir, roles: list[str], limits: ApiLimits | None = None) -> Iterator[FastAPI]:
    """Runtime, joined agents of `roles` and the app with its database, until teardown."""
    database_url = f"sqlite:///{base_dir / 'conductor.db'}"
    run_migrations(database_url)
    engine = create_db_engine(database_url)
    sessions = create_session_factory(engine)
    # A generous heartbeat timeout: a busy CI machine must not fail requests as agents "die".
    conductor_settings = make_settings(database_url=database_url, heartbeat_timeout_s=30.0)
    runtime = ConductorRuntime(
        conductor_settings,
        COST,
        clock=time.time,
        session_factory=sessions,
        grpc_address="127.0.0.1:0",
    ).start()
    agents = []
    try:
        agents = wait_all(
            [AgentProcess(role, SECRET, "--conductor", runtime.address) for role in roles]
        )
        deadline = time.monotonic() + 30
        while len(runtime.agents()) < len(roles) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(runtime.agents()) == len(roles), "the agents did not join"
        app = create_app(conductor_settings, runtime=runtime, limits=limits)
        attach_database(app, sessions, now_s=time.time())
        assert app.openapi()["paths"].keys() == schema.raw_schema["paths"].keys()
        yield app
    finally:
        stop_agents(agents)
        runtime.stop()
        engine.dispose()


@pytest.fixture(scope="module")
def idle_app(tmp_path_factory):
    yield from _conductor(tmp_path_factory.mktemp("idle"), [])


@pytest.fixture(scope="module")
def app_with_agents(tmp_path_factory):
    yield from _conductor(tmp_path_factory.mktemp("agents"), ["prefill", "decode"], SMALL)


def _credentials(case: schemathesis.Case) -> dict[str, str]:
    """The admin token where the operation needs it (it documents a 403), else an API key."""
    needs_admin = "403" in case.operation.definition.raw.get("responses", {})
    return ADMIN_TOKEN if needs_admin else API_KEY


def _steer_to_the_agents(case: schemathesis.Case) -> None:
    """A schema-valid submission names the served model and stays within SMALL, so that it
    runs on the agents instead of stopping at a 404 or 400 (invalid ones stay as they are)."""
    meta = case.meta
    if meta is None or meta.generation.mode is not schemathesis.GenerationMode.POSITIVE:
        return
    body = case.body
    if case.method != "POST" or case.path not in SUBMISSIONS or not isinstance(body, dict):
        return
    body["model"] = "tiny"
    for name in ("max_tokens", "max_completion_tokens"):
        if isinstance(body.get(name), int):
            body[name] = 1 + body[name] % SMALL.max_output_tokens
    for name in ("prompt", "token_ids"):
        ids = body.get(name)
        if isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids):
            body[name] = [i % VOCAB_SIZE for i in ids[:200]]


def _call_and_check(case: schemathesis.Case, app: FastAPI, *, idle: bool = False) -> int:
    """`idle`: the conductor has no agents, so a schema-valid submission is refused with a
    503 that says so (no_prefill_instance, documented): the one 5xx allowed."""
    headers = _credentials(case)
    response = case.call(headers=headers, app=app)
    unavailable = idle and response.status_code == 503 and _no_instance(response.text)
    assert response.status_code < 500 or unavailable, (
        f"{case.operation.label} answered {response.status_code}: {response.text[:500]}\n"
        f"{case.as_curl_command(headers=headers)}"
    )
    # Every enabled check, not_a_server_error included; auth probes go to the same app.
    case.validate_response(
        response,
        headers=headers,
        transport_kwargs={"app": app, "headers": headers},
        excluded_checks=[not_a_server_error] if unavailable else None,
    )
    return response.status_code


def _no_instance(text: str) -> bool:
    try:
        code = json.loads(text)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return False
    return code in ("no_prefill_instance", "no_decode_instance")


@schema.parametrize()
@FUZZ
def test_no_request_gets_a_5xx_from_an_idle_conductor(case, idle_app):
    _call_and_check(case, idle_app, idle=True)


@schema.parametrize()
@FUZZ
def test_no_request_gets_a_5xx_from_a_conductor_with_agents(case, app_with_agents):
    _steer_to_the_agents(case)
    status = _call_and_check(case, app_with_agents)
    ANSWERED_WITH_AGENTS[(f"{case.method} {case.path}", status)] += 1


def test_the_fuzz_ran_submissions_on_the_agents():
    """A fuzz that never got past validation would prove little: each submission route must
    have served some generated request end to end (runs after the fuzz, in file order)."""
    if not ANSWERED_WITH_AGENTS:
        pytest.skip("the fuzz with agents did not run in this session")
    for path in SUBMISSIONS:
        assert ANSWERED_WITH_AGENTS[(f"POST {path}", 200)] > 0, path


SECURED = sorted(
    (method.upper(), path)
    for path, item in schema.raw_schema["paths"].items()
    for method, operation in item.items()
    if isinstance(operation, dict) and operation.get("security")
)


@pytest.mark.parametrize(("method", "path"), SECURED, ids=[f"{m} {p}" for m, p in SECURED])
def test_without_valid_credentials_every_secured_operation_is_401_or_403(idle_app, method, path):
    client = TestClient(idle_app, raise_server_exceptions=False)
    url = path.replace("{", "").replace("}", "")  # any value for path parameters
    body = {} if method in ("POST", "PUT", "PATCH") else None
    wrong = [
        {},
        {"Authorization": "Bearer not-a-key-0123456789"},
        {"x-api-key": "not-a-key-0123456789"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {**API_KEY, "x-api-key": "another-key-0123456789"},
    ]
    for headers in wrong:
        response = client.request(method, url, headers=headers, json=body)
        assert response.status_code == 401, (headers, response.status_code, response.text)
        assert response.json()["error"]["type"] == "authentication_error"
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
    needs_admin = "403" in schema.raw_schema["paths"][path][method.lower()]["responses"]
    if needs_admin:
        response = client.request(method, url, headers=API_KEY, json=body)
        assert response.status_code == 403, response.text
        assert response.json()["error"]["type"] == "permission_error"
