"""AgentMetrics: one agent's Prometheus metrics in a registry of its own, and the HTTP
endpoint that serves them on the address `--metrics-listen` names (and only there).

Loads, pool blocks and bytes per tier and the pool's eviction/demotion/promotion counts are
read from the NodeAgent when scraped (`NodeAgentCollector`), so the hot path does no work
for them. Prefill and decode counts and durations and transport bytes are counted by the
`observe_*`/`record_*` methods, which the agent's call sites invoke.
"""

from collections.abc import Iterator
from threading import Thread
from typing import Literal
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from agents.node.node import NodeAgent, PrefillOutcome
from agents.transport.base import format_address, parse_address

_PREFIX = "kvcentric_agent"

# Prefill: 5 ms to 60 s; decode requests: 10 ms to 10 min (seconds).
PREFILL_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
DECODE_BUCKETS_S = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

TransportDirection = Literal["fetched", "served", "pushed", "received"]


class NodeAgentCollector(Collector):
    """Reads `NodeAgent.report_load()` and the shard's counters at scrape time."""

    def __init__(self, agent: NodeAgent) -> None:
        self.agent = agent

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        load, stats = self.agent.report_load(), self.agent.stats()
        labels = {"instance_id": self.agent.instance_id, "role": self.agent.role}
        names, values = list(labels), list(labels.values())

        def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(f"{_PREFIX}_{name}", documentation, labels=names)
            family.add_metric(values, value)
            return family

        def counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(f"{_PREFIX}_{name}", documentation, labels=names)
            family.add_metric(values, value)
            return family

        yield gauge("prefill_queue_length", "Prefills waiting for the GPU.", load.num_queued)
        yield gauge("prefill_running", "Prefills running.", load.num_running)
        yield gauge("prefill_queued_tokens", "Prompt tokens queued or running.", load.queued_tokens)
        yield gauge("decode_batch_size", "Requests in the decode batch.", load.batch_size)
        yield gauge("decode_context_tokens", "Context tokens in the batch.", load.context_tokens)
        yield gauge("decode_predicted_tbt_seconds", "Predicted TBT.", load.predicted_tbt_s)
        yield gauge("decode_last_step_seconds", "The last decode step's time.", load.last_step_s)
        yield gauge("pending_handoffs", "KV handoffs waiting to decode.", load.num_pending_handoffs)
        yield gauge("pool_pinned_keys", "Keys pinned in the shard.", load.num_pinned_keys)
        tiers = (
            ("dram", load.num_dram_blocks, load.dram_bytes, load.dram_capacity_bytes),
            ("ssd", load.num_ssd_blocks, load.ssd_bytes, load.ssd_capacity_bytes),
        )
        for name, unit, index in (("blocks", "Blocks", 1), ("bytes", "Bytes", 2)):
            family = GaugeMetricFamily(
                f"{_PREFIX}_pool_{name}", f"{unit} in the shard, per tier.", labels=[*names, "tier"]
            )
            for tier in tiers:
                family.add_metric([*values, tier[0]], tier[index])
            yield family
        family = GaugeMetricFamily(
            f"{_PREFIX}_pool_capacity_bytes", "Capacity per tier.", labels=[*names, "tier"]
        )
        for tier in tiers:
            family.add_metric([*values, tier[0]], tier[3])
        yield family
        yield counter("pool_stored_blocks", "Blocks that entered the shard.", stats.num_stored)
        yield counter("pool_evicted_blocks", "Blocks dropped from every tier.", stats.num_evicted)
        yield counter("pool_demoted_blocks", "Blocks moved DRAM -> SSD.", stats.num_demoted)
        yield counter("pool_promoted_blocks", "Blocks moved SSD -> DRAM.", stats.num_promoted)
        yield counter("pool_refused_blocks", "Blocks the shard had no room for.", stats.num_refused)
        yield counter("pool_corrupt_blocks", "Blocks found corrupt.", stats.num_corrupt)
        hits = CounterMetricFamily(
            f"{_PREFIX}_pool_lookups", "Block lookups by result.", labels=[*names, "result"]
        )
        hits.add_metric([*values, "dram_hit"], stats.num_dram_hits)
        hits.add_metric([*values, "ssd_hit"], stats.num_ssd_hits)
        hits.add_metric([*values, "miss"], stats.num_misses)
        yield hits


class AgentMetrics:
    """The registry of one agent: the scrape-time collector plus event counters."""

    def __init__(self, agent: NodeAgent) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(NodeAgentCollector(agent))
        r = self.registry
        self.prefills = Counter(f"{_PREFIX}_prefills", "Prefills completed.", registry=r)
        self.prefill_seconds = Histogram(
            f"{_PREFIX}_prefill_seconds", "Prefill time, queue included.",
            buckets=PREFILL_BUCKETS_S, registry=r,
        )  # fmt: skip
        self.prefill_tokens = Counter(
            f"{_PREFIX}_prefill_tokens", "Prompt tokens by how they were obtained.", ["source"],
            registry=r,
        )  # fmt: skip
        self.decodes = Counter(f"{_PREFIX}_decodes", "Decodes finished.", registry=r)
        self.decode_seconds = Histogram(
            f"{_PREFIX}_decode_seconds", "Decode time of one request, start to last token.",
            buckets=DECODE_BUCKETS_S, registry=r,
        )  # fmt: skip
        self.decode_tokens = Counter(f"{_PREFIX}_decode_tokens", "Tokens decoded.", registry=r)
        self.transport_bytes = Counter(
            f"{_PREFIX}_transport_bytes", "KV bytes moved by the data plane, by direction.",
            ["direction"], registry=r,
        )  # fmt: skip

    def observe_prefill(self, outcome: PrefillOutcome) -> None:
        """One finished prefill: its time and its reused/fetched/computed tokens."""
        self.prefills.inc()
        self.prefill_seconds.observe(outcome.timings.get("total_s", 0.0))
        local = outcome.num_reused_tokens - outcome.num_fetched_tokens
        self.prefill_tokens.labels("local").inc(max(local, 0))
        self.prefill_tokens.labels("fetched").inc(outcome.num_fetched_tokens)
        self.prefill_tokens.labels("computed").inc(outcome.num_tokens - outcome.num_reused_tokens)

    def observe_decode(self, seconds: float, num_tokens: int) -> None:
        self.decodes.inc()
        self.decode_seconds.observe(seconds)
        self.decode_tokens.inc(num_tokens)

    def record_transport_bytes(self, direction: TransportDirection, num_bytes: int) -> None:
        self.transport_bytes.labels(direction).inc(num_bytes)


class MetricsServer:
    """Serves `registry` over HTTP on `listen` ("host:port"; port 0 picks one) only."""

    def __init__(self, registry: CollectorRegistry, listen: str) -> None:
        host, port = parse_address(listen)
        server: WSGIServer
        thread: Thread
        server, thread = start_http_server(port, addr=host, registry=registry)
        self._server, self._thread = server, thread
        self.address = format_address(host, server.server_port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)
