"""The app shell through a real TestClient: API key and admin token dependencies (401/403
with messages), open health endpoints, and JSON errors for oversized, malformed and failing
requests. The protected routes exist only here, mounted by the fixture."""

from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel

from backend.api.app import create_app
from backend.api.auth import AdminToken, ApiKey
from backend.settings import load_settings

KEY_ALICE = "alice-key-0123456789"
KEY_BARE = "bare-key-0123456789ab"
ADMIN = "admin-token-0123456789"
LIMIT_BYTES = 2048


class Submission(BaseModel):
    prompt: str
    max_tokens: int


def build_app(**checks) -> FastAPI:
    settings = load_settings(
        {
            "api_keys": f"alice:{KEY_ALICE},{KEY_BARE}",
            "admin_token": ADMIN,
            "agent_secret": "agent-secret-0123456789",
            "max_request_body_bytes": LIMIT_BYTES,
        }
    )
    app = create_app(settings, readiness_checks=checks)

    @app.post("/test/submit")
    def submit(principal: ApiKey, body: Submission) -> dict[str, str]:
        return {"principal": principal.name, "prompt": body.prompt}

    @app.put("/test/config")
    def change(principal: AdminToken) -> dict[str, str]:
        return {"principal": principal.name}

    @app.get("/test/crash")
    def crash() -> None:
        raise RuntimeError("secret internals")

    return app


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(build_app(), raise_server_exceptions=False) as client:
        yield client


BODY = {"prompt": "hello", "max_tokens": 4}


def error_of(response) -> dict:
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["message"]
    return error


def test_missing_credentials_get_401_with_a_challenge(client: TestClient) -> None:
    for response in (client.post("/test/submit", json=BODY), client.put("/test/config")):
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == 'Bearer realm="kvcentric"'
        error = error_of(response)
        assert error["code"] == "missing_credentials"
        assert error["type"] == "authentication_error"
        assert "Authorization: Bearer" in error["message"] and "x-api-key" in error["message"]


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": "Bearer wrong-key-0123456789"},
        {"x-api-key": "wrong-key-0123456789"},
        {"Authorization": f"Bearer {KEY_ALICE}x"},
        {"Authorization": f"Bearer {KEY_ALICE[:-1]}"},
    ],
)
def test_wrong_credentials_get_401(client: TestClient, headers: dict[str, str]) -> None:
    for response in (
        client.post("/test/submit", json=BODY, headers=headers),
        client.put("/test/config", headers=headers),
    ):
        assert response.status_code == 401
        assert 'error="invalid_token"' in response.headers["www-authenticate"]
        error = error_of(response)
        assert (error["code"], error["message"]) == ("invalid_credentials", "invalid credentials")


def test_a_non_bearer_authorization_header_is_explained(client: TestClient) -> None:
    response = client.post("/test/submit", json=BODY, headers={"Authorization": "Basic abc"})
    assert response.status_code == 401
    assert error_of(response)["message"] == "the Authorization header must be 'Bearer <secret>'"


def test_conflicting_headers_are_refused(client: TestClient) -> None:
    headers = {"Authorization": f"Bearer {KEY_ALICE}", "x-api-key": KEY_BARE}
    response = client.post("/test/submit", json=BODY, headers=headers)
    assert response.status_code == 401
    assert error_of(response)["code"] == "conflicting_credentials"


@pytest.mark.parametrize(
    ("headers", "name"),
    [
        ({"Authorization": f"Bearer {KEY_ALICE}"}, "alice"),
        ({"authorization": f"bearer {KEY_ALICE}"}, "alice"),
        ({"x-api-key": KEY_ALICE}, "alice"),
        ({"x-api-key": KEY_BARE}, None),
        ({"Authorization": f"Bearer {ADMIN}"}, "admin"),
    ],
)
def test_api_keys_and_the_admin_token_may_submit(
    client: TestClient, headers: dict[str, str], name: str | None
) -> None:
    response = client.post("/test/submit", json=BODY, headers=headers)
    assert response.status_code == 200
    principal = response.json()["principal"]
    if name is None:  # a bare key is named by a digest prefix, never by the key itself
        assert principal.startswith("key-") and KEY_BARE not in principal
    else:
        assert principal == name


def test_an_api_key_may_not_change_configuration(client: TestClient) -> None:
    response = client.put("/test/config", headers={"x-api-key": KEY_ALICE})
    assert response.status_code == 403
    error = error_of(response)
    assert error["code"] == "admin_required" and error["type"] == "permission_error"
    assert error["message"] == (
        "API key 'alice' may not change configuration: this needs the admin token"
    )


def test_the_admin_token_changes_configuration(client: TestClient) -> None:
    for headers in ({"Authorization": f"Bearer {ADMIN}"}, {"x-api-key": ADMIN}):
        response = client.put("/test/config", headers=headers)
        assert response.status_code == 200
        assert response.json() == {"principal": "admin"}


def test_health_endpoints_are_open(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ready", "checks": {}}


def test_readiness_reports_failing_checks_as_503() -> None:
    async def database() -> bool:
        return True

    async def agents() -> bool:
        return False

    async def broken() -> bool:
        raise ConnectionError("db at postgresql://kvc:hunter2@db")

    app = build_app(database=database, agents=agents, broken=broken)
    with TestClient(app) as client:
        response = client.get("/readyz")
    assert response.status_code == 503
    assert error_of(response)["message"] == "not ready: agents, broken"
    assert response.json()["checks"] == {
        "database": "ok",
        "agents": "failing",
        "broken": "failing (ConnectionError)",
    }
    assert "hunter2" not in response.text


def test_an_oversized_body_gets_413_before_auth(client: TestClient) -> None:
    big = {"prompt": "x" * (LIMIT_BYTES + 1), "max_tokens": 4}
    for headers in ({}, {"x-api-key": KEY_ALICE}):
        response = client.post("/test/submit", json=big, headers=headers)
        assert response.status_code == 413
        error = error_of(response)
        assert error["code"] == "body_too_large" and str(LIMIT_BYTES) in error["message"]


def test_an_oversized_chunked_body_gets_413(client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"prompt": "'
        for _ in range(LIMIT_BYTES // 256 + 1):
            yield b"y" * 256
        yield b'", "max_tokens": 4}'

    response = client.post(
        "/test/submit",
        content=chunks(),
        headers={"x-api-key": KEY_ALICE, "content-type": "application/json"},
    )
    assert "content-length" not in response.request.headers
    assert response.status_code == 413
    assert error_of(response)["code"] == "body_too_large"


def test_a_body_at_the_limit_passes(client: TestClient) -> None:
    padding = LIMIT_BYTES - len(b'{"prompt":"","max_tokens":4}')
    content = b'{"prompt":"' + b"z" * padding + b'","max_tokens":4}'
    assert len(content) == LIMIT_BYTES
    response = client.post(
        "/test/submit",
        content=content,
        headers={"x-api-key": KEY_ALICE, "content-type": "application/json"},
    )
    assert response.status_code == 200


def test_an_invalid_content_length_gets_400(client: TestClient) -> None:
    response = client.post(
        "/test/submit", content=b"{}", headers={"x-api-key": KEY_ALICE, "content-length": "-5"}
    )
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_content_length"


def test_malformed_json_gets_400_with_a_message(client: TestClient) -> None:
    response = client.post(
        "/test/submit",
        content=b'{"prompt": "hi", ',
        headers={"x-api-key": KEY_ALICE, "content-type": "application/json"},
    )
    assert response.status_code == 400  # as OpenAI answers; 422 is for wrong fields
    error = error_of(response)
    assert error["code"] == "invalid_json"
    assert error["message"].startswith("invalid request: body: malformed JSON")


def test_invalid_fields_get_422_naming_each_field(client: TestClient) -> None:
    response = client.post(
        "/test/submit",
        json={"max_tokens": "many", "secret_field": "hunter2"},
        headers={"x-api-key": KEY_ALICE},
    )
    assert response.status_code == 422
    error = error_of(response)
    assert [field["field"] for field in error["fields"]] == ["body.prompt", "body.max_tokens"]
    assert error["param"] == "prompt"
    assert "body.prompt: Field required" in error["message"]
    assert "many" not in response.text and "hunter2" not in response.text


def test_unknown_routes_and_methods_answer_json(client: TestClient) -> None:
    response = client.get("/nowhere")
    assert response.status_code == 404
    assert error_of(response)["message"] == "Not Found"
    response = client.delete("/healthz")
    assert response.status_code == 405
    assert "GET" in response.headers["allow"]
    error_of(response)


def test_an_unexpected_error_is_a_500_json_without_internals(client: TestClient) -> None:
    response = client.get("/test/crash")
    assert response.status_code == 500
    error = error_of(response)
    assert (error["type"], error["message"]) == ("server_error", "internal server error")
    assert "secret internals" not in response.text and "Traceback" not in response.text


def test_openapi_documents_both_ways_to_authenticate(client: TestClient) -> None:
    schemes = client.get("/openapi.json").json()["components"]["securitySchemes"]
    assert schemes["HTTPBearer"]["scheme"] == "bearer"
    assert schemes["APIKeyHeader"]["name"] == "x-api-key"
