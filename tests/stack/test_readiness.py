"""Readiness on `kvcentric conductor`'s start path: /readyz is ready only when the database
answers and a prefill and a decode instance serve; until then a request is refused with 503
(the cluster cannot serve), not 429 (the client sent too much)."""

import time

import httpx

from backend.cli.children import free_port
from tests.harness.agents import AgentProcess, stop_agents, wait_all
from tests.harness.stack import conductor_stack
from tests.runtime.conftest import make_settings

HEADERS = {"x-api-key": "api-key-0123456789"}


def test_ready_only_when_both_roles_serve_and_503_until_then(tmp_path) -> None:
    settings = make_settings(
        database_url=f"sqlite:///{tmp_path / 'conductor.db'}", grpc_port=free_port()
    )
    with conductor_stack(settings, ["decode"], profile="tiny-cpu") as stack:
        not_ready = httpx.get(f"{stack.url}/readyz")
        assert not_ready.status_code == 503, not_ready.text
        assert not_ready.json()["checks"] == {"database": "ok", "agents": "failing"}

        refused = httpx.post(
            f"{stack.url}/v1/completions",
            json={"model": "tiny", "prompt": "hello", "max_tokens": 2},
            headers=HEADERS,
        )
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "no_prefill_instance"
        assert int(refused.headers["Retry-After"]) >= 1

        secret = settings.agent_secret.get_secret_value()
        prefill = wait_all([AgentProcess("prefill", secret, "--conductor", stack.runtime.address)])
        try:
            deadline_s = time.monotonic() + 30
            while (ready := httpx.get(f"{stack.url}/readyz")).status_code != 200:
                assert time.monotonic() < deadline_s, ready.text
                time.sleep(0.1)
            assert ready.json() == {"status": "ready", "checks": {"database": "ok", "agents": "ok"}}
            served = httpx.post(
                f"{stack.url}/v1/completions",
                json={"model": "tiny", "prompt": "hello", "max_tokens": 2},
                headers=HEADERS,
                timeout=30,
            )
            assert served.status_code == 200, served.text
        finally:
            stop_agents(prefill)
