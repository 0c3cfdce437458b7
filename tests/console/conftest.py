"""A real backend for the console's tests: the Conductor (started by `kvcentric conductor`'s
own start path) on a SQLite file, served by uvicorn on loopback, with one prefill and one
decode `tiny` agent, and some traffic already recorded: completed requests sharing a prefix
(cache hits) and requests rejected at admission."""

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from streamlit.testing.v1 import AppTest

from backend.cli.children import free_port
from backend.cli.conductor_cmd import Conductor
from console.client import BackendClient
from tests.harness.agents import AgentProcess
from tests.harness.stack import conductor_stack
from tests.runtime.conftest import make_settings

API_KEY = "api-key-0123456789"
ADMIN_TOKEN = "admin-token-0123456789"
APP_PATH = Path(__file__).resolve().parents[2] / "console" / "app.py"
APP_TIMEOUT_S = 30.0
NUM_COMPLETED = 6
NUM_REJECTED = 3
# Shared by every completed prompt: two full blocks of 64 tokens, reused after the first.
SHARED_PREFIX = list(range(1, 129))


@dataclass
class Backend:
    """The running stack; `get` reads an endpoint with the API key, as the console does."""

    url: str
    conductor: Conductor
    agents: list[AgentProcess]

    def get(self, path: str, **params: object) -> Any:
        return self._get(path, params).json()

    def get_text(self, path: str, **params: object) -> str:
        return self._get(path, params).text

    def put_config(self, config: dict[str, Any]) -> None:
        """Change the configuration with the admin token (no prediction), as the console
        sends it (an infinite threshold as "inf")."""
        admin = BackendClient(self.url, api_key=API_KEY, admin_token=ADMIN_TOKEN)
        admin.change_config(config)

    def _get(self, path: str, params: dict[str, object]) -> httpx.Response:
        response = httpx.get(
            self.url + path, params=params, headers={"Authorization": f"Bearer {API_KEY}"}
        )
        response.raise_for_status()
        return response


def _submit(url: str, body: dict) -> httpx.Response:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    return httpx.post(f"{url}/v1/native/requests", json=body, headers=headers, timeout=60)


def _record_traffic(url: str) -> None:
    for index in range(NUM_COMPLETED):
        tokens = SHARED_PREFIX + [200 + index] * (40 + 10 * index)
        response = _submit(url, {"token_ids": tokens, "max_tokens": 4})
        assert response.status_code == 200, response.text
    for index in range(NUM_REJECTED):
        body = {"token_ids": [7 + index] * 90, "max_tokens": 2, "ttft_slo_s": 1e-6}
        response = _submit(url, body)
        assert response.status_code == 429, response.text


@pytest.fixture(scope="session")
def backend(tmp_path_factory) -> Backend:
    database = tmp_path_factory.mktemp("console") / "conductor.db"
    settings = make_settings(
        database_url=f"sqlite:///{database}",
        grpc_port=free_port(),
        load_sample_interval_s=0.5,
    )
    with conductor_stack(settings, ["prefill", "decode"]) as stack:
        _record_traffic(stack.url)
        time.sleep(1.5)  # a few load samples after the traffic
        yield Backend(url=stack.url, conductor=stack.conductor, agents=stack.agents)


@pytest.fixture
def app(backend: Backend, monkeypatch) -> AppTest:
    """The console's entry script, pre-filled with the backend's URL and API key (not the
    admin token) the way `kvcentric console` passes them."""
    monkeypatch.setenv("KVC_CONSOLE_BACKEND", backend.url)
    monkeypatch.setenv("KVC_CONSOLE_API_KEY", API_KEY)
    monkeypatch.delenv("KVC_CONSOLE_ADMIN_TOKEN", raising=False)
    return AppTest.from_file(APP_PATH, default_timeout=APP_TIMEOUT_S)
