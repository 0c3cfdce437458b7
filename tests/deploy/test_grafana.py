"""The Grafana dashboards (deploy/grafana): the JSON files are what build.py writes, and every
metric a panel queries is exported by a running Conductor or agent (scraped here)."""

import importlib.util
import re
import time
import urllib.request
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from backend.cli.children import free_port
from tests.harness.agents import AgentProcess
from tests.harness.stack import conductor_stack
from tests.runtime.conftest import make_settings

BUILD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "build.py"
API_KEY = "api-key-0123456789"
METRIC = re.compile(r"\bkvcentric_[a-z0-9_]+")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}


def _build_module():
    spec = importlib.util.spec_from_file_location("grafana_build", BUILD)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _exported(text: str) -> dict[str, list]:
    """Every series name a scrape can hold (a counter's _total, a histogram's _bucket...,
    even before its first sample), with the samples it holds now."""
    names: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for suffix in SUFFIXES.get(family.type, ("",)):
            names[family.name + suffix] = []
        for sample in family.samples:
            names.setdefault(sample.name, []).append(sample)
    return names


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def test_the_json_files_are_what_build_writes() -> None:
    assert _build_module().main(["--check"]) == 0, "run python deploy/grafana/build.py"


def test_every_queried_metric_is_exported_by_a_conductor_or_an_agent(tmp_path) -> None:
    build = _build_module()
    queried = {
        name
        for dashboard in build.DASHBOARDS
        for _, panels in dashboard.rows
        for panel in panels
        for expr, _ in panel.queries
        for name in METRIC.findall(expr)
    }
    settings = make_settings(
        database_url=f"sqlite:///{tmp_path / 'conductor.db'}",
        grpc_port=free_port(),
        load_sample_interval_s=0.2,
    )
    metrics_address = f"127.0.0.1:{free_port()}"
    agent = AgentProcess("decode", "agent-secret-0123456789", "--metrics-listen", metrics_address)
    try:
        agent.wait_ready()
        with conductor_stack(settings, ["prefill", "decode"]) as stack:
            response = httpx.post(
                f"{stack.url}/v1/native/requests",
                json={"token_ids": list(range(1, 80)), "max_tokens": 4},
                headers={"Authorization": f"Bearer {API_KEY}"},
                timeout=60,
            )
            assert response.status_code == 200, response.text
            deadline = time.monotonic() + 20
            while True:  # the load sampler's gauges, for both roles
                conductor = _exported(_scrape(f"{stack.url}/metrics"))
                roles = {s.labels["role"] for s in conductor.get("kvcentric_instance_load", [])}
                if roles == {"prefill", "decode"} or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        agent_names = _exported(_scrape(f"http://{metrics_address}/metrics"))
    finally:
        agent.terminate()
    assert roles == {"prefill", "decode"}
    assert conductor["kvcentric_slo_seconds"], "the SLOs in force"
    assert conductor["kvcentric_reachable_tokens_total"][0].value >= 0
    missing = sorted(queried - set(conductor) - set(agent_names))
    assert not missing, f"queried by a dashboard, exported by nothing: {missing}"
