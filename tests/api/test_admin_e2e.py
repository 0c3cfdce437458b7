"""Configuration, audit, trace export and read endpoints over a real runtime and app, started
by `kvcentric conductor`'s own start path on a SQLite file and served by uvicorn on loopback.
No agents: requests are rejected at admission, which still records them as traffic."""

import socket
import threading
import time

import httpx
import pytest
import uvicorn
from typer.testing import CliRunner

from backend.cli import app as cli_app
from backend.cli.children import free_port
from backend.cli.conductor_cmd import start_conductor
from backend.traces.loader import iter_trace
from tests.runtime.conftest import make_settings

ADMIN = {"Authorization": "Bearer admin-token-0123456789"}
KEY = {"Authorization": "Bearer api-key-0123456789"}


class Served:
    """One conductor (runtime + app) served on a loopback port until `stop()`."""

    def __init__(self, database_url: str) -> None:
        settings = make_settings(database_url=database_url, grpc_port=free_port())
        self.conductor = start_conductor(settings)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(
            uvicorn.Config(self.conductor.app, log_level="warning", lifespan="off")
        )
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)

    @property
    def core_config(self):
        return self.conductor.runtime.core.config

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.conductor.stop()


@pytest.fixture
def database_url(tmp_path):
    return f"sqlite:///{tmp_path / 'conductor.db'}"


@pytest.fixture
def served(database_url):
    started = Served(database_url)
    yield started
    started.stop()


def test_the_first_start_saves_the_settings_as_version_1(served):
    body = httpx.get(f"{served.url}/v1/config", headers=KEY).json()
    assert body["version"] == 1
    assert body["config"]["kvcache_balancing_threshold"] == 2.0
    audit = httpx.get(f"{served.url}/v1/audit", headers=ADMIN).json()
    assert [(e["actor"], e["action"], e["config_version"]) for e in audit] == [
        ("settings", "config.initial", 1)
    ]


def test_changing_configuration_needs_the_admin_token(served):
    change = {"config": {"kvcache_balancing_threshold": 8.0}}
    anonymous = httpx.put(f"{served.url}/v1/config", json=change)
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["message"].startswith("missing credentials")
    with_key = httpx.put(f"{served.url}/v1/config", json=change, headers=KEY)
    assert with_key.status_code == 403
    assert "needs the admin token" in with_key.json()["error"]["message"]
    assert served.core_config.kvcache_balancing_threshold == 2.0


def test_an_admin_change_applies_to_the_running_core_and_is_audited(served):
    prediction = {"p99_ttft_s": 1.5, "num_rejected": 3}
    change = {
        "config": {"kvcache_balancing_threshold": 4.0, "ttft_slo_s": 12.0},
        "prediction": prediction,
    }
    response = httpx.put(f"{served.url}/v1/config", json=change, headers=ADMIN)
    assert response.status_code == 200, response.text
    assert response.json()["version"] == 2
    assert served.core_config.kvcache_balancing_threshold == 4.0
    assert served.core_config.ttft_slo_s == 12.0
    assert served.conductor.app.state.served.default_ttft_slo_s == 12.0
    latest = httpx.get(f"{served.url}/v1/audit", headers=KEY).json()[0]
    assert latest["actor"] == "admin" and latest["config_version"] == 2
    assert latest["old_value"]["kvcache_balancing_threshold"] == 2.0
    assert latest["new_value"]["kvcache_balancing_threshold"] == 4.0
    assert latest["prediction"] == prediction
    assert httpx.get(f"{served.url}/v1/config", headers=KEY).json()["version"] == 2


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"kvcache_balancing_threshold": 0.5}, "kvcache_balancing_threshold must be in [1, inf]"),
        ({"prefill_scheduler": "fastest"}, "unknown prefill_scheduler 'fastest'"),
        ({"ttft_slo": 3}, "unknown setting(s): ttft_slo"),
        ({"block_size": 128}, "block_size cannot change while the Conductor runs"),
        ({"eviction_policy": "lfu"}, "eviction_policy cannot change while the cluster runs"),
    ],
)
def test_an_invalid_configuration_is_400_and_changes_nothing(served, config, words):
    response = httpx.put(f"{served.url}/v1/config", json={"config": config}, headers=ADMIN)
    assert response.status_code == 400
    assert words in response.json()["error"]["message"]
    assert httpx.get(f"{served.url}/v1/config", headers=KEY).json()["version"] == 1


def test_a_stale_expected_version_is_409(served):
    change = {"config": {"kvcache_balancing_threshold": 3.0}, "expected_version": 7}
    response = httpx.put(f"{served.url}/v1/config", json=change, headers=ADMIN)
    assert response.status_code == 409
    assert served.core_config.kvcache_balancing_threshold == 2.0


def test_a_change_that_changes_nothing_saves_no_version_and_no_audit_entry(served):
    in_force = httpx.get(f"{served.url}/v1/config", headers=KEY).json()
    audit = httpx.get(f"{served.url}/v1/audit", headers=KEY).json()
    same = {"kvcache_balancing_threshold": in_force["config"]["kvcache_balancing_threshold"]}
    for config in ({}, same):
        response = httpx.put(f"{served.url}/v1/config", json={"config": config}, headers=ADMIN)
        assert response.status_code == 200, response.text
        assert response.json() == in_force
    stale = {"config": {}, "expected_version": in_force["version"] + 5}
    assert httpx.put(f"{served.url}/v1/config", json=stale, headers=ADMIN).status_code == 409
    assert httpx.get(f"{served.url}/v1/audit", headers=KEY).json() == audit
    assert httpx.get(f"{served.url}/v1/config", headers=KEY).json() == in_force


def test_a_restart_on_the_same_database_keeps_configuration_and_history(database_url):
    first = Served(database_url)
    try:
        change = {"config": {"kvcache_balancing_threshold": 6.0, "rejection_policy": "early"}}
        assert httpx.put(f"{first.url}/v1/config", json=change, headers=ADMIN).status_code == 200
        body = {"token_ids": [1, 2, 3], "max_tokens": 2}  # no agents: refused, recorded
        refused = httpx.post(f"{first.url}/v1/native/requests", json=body, headers=KEY)
        assert refused.status_code == 503  # no agent serves: unavailable, not overload
        request_id = refused.json()["error"]["request_id"]
    finally:
        first.stop()
    second = Served(database_url)
    try:
        assert second.core_config.kvcache_balancing_threshold == 6.0
        assert second.core_config.rejection_policy == "early"
        assert httpx.get(f"{second.url}/v1/config", headers=KEY).json()["version"] == 2
        # History too: the request served before the restart is read from the database.
        record = httpx.get(f"{second.url}/v1/requests/{request_id}", headers=KEY)
        assert record.status_code == 200, record.text
        outcome = record.json()["outcome"]
        assert (outcome["state"], outcome["stage"]) == ("rejected", "admission")
        assert record.json()["num_input_tokens"] == 3
    finally:
        second.stop()


def test_recorded_traffic_exports_as_a_trace_and_counts_in_stats(served, tmp_path):
    start_s = time.time()
    for length in (100, 300):
        body = {"token_ids": list(range(1, length + 1)), "max_tokens": 5}
        response = httpx.post(f"{served.url}/v1/native/requests", json=body, headers=KEY)
        assert response.status_code == 503  # no agents: rejected at admission, still recorded
    end_s = time.time() + 1
    exported = httpx.get(
        f"{served.url}/v1/export/trace",
        params={"start_s": start_s, "end_s": end_s},
        headers=KEY,
    )
    assert exported.status_code == 200
    assert exported.headers["content-type"].startswith("application/x-ndjson")
    path = tmp_path / "exported.jsonl"
    path.write_text(exported.text)
    rows = list(iter_trace(path))
    assert [(row.input_length, row.output_length) for row in rows] == [(100, 5), (300, 5)]
    stats = httpx.get(f"{served.url}/v1/stats", params={"window_s": 60}, headers=KEY).json()
    assert stats["by_outcome"] == {"rejected": 2}
    assert sum(stats["rejections_by_stage"].values()) == 2
    assert stats["ttft_s"] == {"p50": None, "p90": None, "p99": None}
    assert httpx.get(f"{served.url}/v1/agents", headers=KEY).json() == []
    links = httpx.get(f"{served.url}/v1/links", headers=KEY).json()
    assert links["measured"] == [] and links["profile_bandwidth_bytes_per_s"] > 0
    assert httpx.get(f"{served.url}/v1/links").status_code == 401


def test_export_refuses_an_empty_window_and_anonymous_callers(served):
    window = {"start_s": 10, "end_s": 10}
    assert httpx.get(f"{served.url}/v1/export/trace", params=window, headers=KEY).status_code == 400
    assert httpx.get(f"{served.url}/v1/export/trace", params=window).status_code == 401


def test_the_conductor_command_refuses_bad_settings_with_one_line_and_exit_2(monkeypatch):
    monkeypatch.setenv("KVC_API_KEYS", "cli:api-key-0123456789")
    monkeypatch.setenv("KVC_ADMIN_TOKEN", "admin-token-0123456789")
    monkeypatch.setenv("KVC_AGENT_SECRET", "agent-secret-0123456789")
    result = CliRunner().invoke(cli_app, ["conductor", "--port", "70000"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines == ["error: --port: must be between 1 and 65535, got 70000"]


def test_an_infinite_threshold_travels_as_inf_and_survives_a_restart(database_url):
    first = Served(database_url)
    try:
        change = {"config": {"kvcache_balancing_threshold": "inf"}}
        reply = httpx.put(f"{first.url}/v1/config", json=change, headers=ADMIN)
        assert reply.status_code == 200, reply.text
        assert reply.json()["config"]["kvcache_balancing_threshold"] == "inf"
        assert first.core_config.kvcache_balancing_threshold == float("inf")
        audit = httpx.get(f"{first.url}/v1/audit", headers=KEY).json()
        assert audit[0]["new_value"]["kvcache_balancing_threshold"] == "inf"
    finally:
        first.stop()
    second = Served(database_url)
    try:
        assert second.core_config.kvcache_balancing_threshold == float("inf")
        body = httpx.get(f"{second.url}/v1/config", headers=KEY).json()
        assert body["config"]["kvcache_balancing_threshold"] == "inf"
    finally:
        second.stop()
