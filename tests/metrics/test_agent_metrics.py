"""Agent metrics: a real agent serves Prometheus text on the --metrics-listen loopback
address, and the collector reads a real NodeAgent's load and pool at scrape time."""

import socket
import urllib.request

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agents.node.metrics import AgentMetrics
from agents.node.node import NodeAgent
from agents.node.settings import AgentSettings
from tests.harness.agents import AgentProcess, prefill_request

SECRET = "agent-secret-0123456789"


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def names_in(text: str) -> set[str]:
    return {sample.name for f in text_string_to_metric_families(text) for sample in f.samples}


def test_agent_serves_metrics_on_the_given_loopback_address() -> None:
    address = f"127.0.0.1:{free_loopback_port()}"
    agent = AgentProcess("prefill", SECRET, "--metrics-listen", address).wait_ready()
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
            assert response.headers["Content-Type"].startswith("text/plain")
            text = response.read().decode()
    finally:
        assert agent.terminate() == 0
    names = names_in(text)
    for name in (
        "kvcentric_agent_prefill_queue_length",
        "kvcentric_agent_decode_batch_size",
        "kvcentric_agent_pool_blocks",
        "kvcentric_agent_pool_bytes",
        "kvcentric_agent_pool_evicted_blocks_total",
        "kvcentric_agent_prefills_total",
        "kvcentric_agent_prefill_seconds_count",
    ):
        assert name in names, name
    assert f'instance_id="{agent.instance_id}"' in text


def test_a_served_prefill_is_counted_with_its_tokens_and_time() -> None:
    address = f"127.0.0.1:{free_loopback_port()}"
    agent = AgentProcess("prefill", SECRET, "--metrics-listen", address).wait_ready()
    try:
        agent.stub.DispatchPrefill(prefill_request("m1", list(range(1, 101))), timeout=60)
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        assert agent.terminate() == 0
    samples = {
        (s.name, s.labels.get("source")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("kvcentric_agent_prefills_total", None)] == 1
    assert samples[("kvcentric_agent_prefill_seconds_count", None)] == 1
    assert samples[("kvcentric_agent_prefill_seconds_sum", None)] > 0
    assert samples[("kvcentric_agent_prefill_tokens_total", "computed")] == 100
    assert samples[("kvcentric_agent_prefill_tokens_total", "fetched")] == 0


def test_collector_reads_the_agent_when_scraped() -> None:
    settings = AgentSettings("prefill", "127.0.0.1:0", "127.0.0.1:0", SECRET, block_size=16)
    agent = NodeAgent(settings, "p0")
    try:
        metrics = AgentMetrics(agent)
        before = _samples(metrics)
        keys = [1, 2, 3]
        blocks = [bytes(agent.shard.block_bytes)] * len(keys)
        agent.shard.store(keys, blocks, 0.0, 0)
        after = _samples(metrics)
        metrics.record_transport_bytes("served", 4096)
    finally:
        agent.close()
    dram = 'kvcentric_agent_pool_blocks{instance_id="p0",role="prefill",tier="dram"}'
    assert before[dram] == 0
    assert after[dram] == 3
    assert _samples(metrics)['kvcentric_agent_transport_bytes_total{direction="served"}'] == 4096


def _samples(metrics: AgentMetrics) -> dict[str, float]:
    text = generate_latest(metrics.registry).decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples
