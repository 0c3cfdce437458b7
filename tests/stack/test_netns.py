"""Beyond loopback: the Conductor and its agents each in a network namespace of their own,
joined by veth pairs and a bridge (backend/bench/netns.py), every process bound to its
namespace's address. gRPC, the KV hand-off and fetches between prefill agents cross real
links; `tc netem` adds delay and loss. Bounded: one short replay per test."""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from backend.bench.netns import VirtualHosts, missing_reason, netem_missing_reason
from backend.cli.children import KVCENTRIC, get_json, start_local_stack
from backend.traces import SHIPPED_TRACE

pytestmark = pytest.mark.skipif(missing_reason() is not None, reason=str(missing_reason()))
SETTLE_S = 20.0


def _tag() -> str:
    return f"t{os.getpid() % 10000}"


def _replay(stack, out: Path, minutes: str, speed: str) -> list[dict]:
    """`kvcentric replay` from this (the root) namespace, through the bridge."""
    args = [
        KVCENTRIC, "replay", "--url", stack.base_url, "--trace", str(SHIPPED_TRACE),
        "--minutes", minutes, "--length-scale", "0.03125", "--speed", speed,
        "--out", str(out),
    ]  # fmt: skip
    result = subprocess.run(
        args, env=stack.env, capture_output=True, text=True, timeout=240, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def _settled_report(stack, num_sent: int) -> dict:
    """/v1/report once every request the replay sent has a terminal state."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        report = get_json(f"{stack.base_url}/v1/report", stack.api_key)
        assert isinstance(report, dict)
        ended = sum(
            report.get(key) or 0
            for key in ("num_completed", "num_rejected", "num_failed", "num_cancelled")
        )
        if ended >= num_sent or time.monotonic() > deadline:
            return report
        time.sleep(0.5)


def _two_prefill_stack(tmp_path: Path, net: VirtualHosts):
    """The Conductor on the first host, 2 prefill agents and 1 decode agent on the others;
    at threshold 1 a prefill agent fetches any longer prefix the other holds."""
    return start_local_stack(
        tmp_path,
        num_prefill=2,
        num_decode=1,
        block_size=16,
        profile="tiny-cpu",
        env={"KVC_KVCACHE_BALANCING_THRESHOLD": "1"},
        hosts=net.hosts,
    )


def test_a_replay_across_namespaces_fetches_between_agents_at_each_links_speed(
    tmp_path,
) -> None:
    """Every agent is bound to its own namespace's address, not loopback, and a replay across
    the namespaces ends every request with KV fetched between the prefill agents. The link
    between them is shaped one way at 8 Mbit/s and the other way at 80 Mbit/s (the hand-off
    to the decode agent at full speed): the Conductor measures each pair from its fetches
    and believes it as fast as they went (GET /v1/links, which routing's transfer branch
    uses: tests/policy/test_links.py shows a slow pair fetched from less). Which way the
    fetches go depends on which agent a hot prefix reached first, so both ways are shaped
    and each pair fetched over is checked against its own rate."""
    with VirtualHosts(4, tag=_tag()) as net:
        stack = _two_prefill_stack(tmp_path, net)
        try:
            agents = get_json(f"{stack.base_url}/v1/agents", stack.api_key)
            assert isinstance(agents, list) and len(agents) == 3
            addresses = {h.address for h in net.hosts[1:]}
            for agent in agents:
                assert agent["rpc_address"].rpartition(":")[0] in addresses, agent
                assert agent["data_address"].rpartition(":")[0] in addresses, agent
            by_address = {a["data_address"].rpartition(":")[0]: a for a in agents}
            first, second = (by_address[h.address]["instance_id"] for h in net.hosts[1:3])
            assert {by_address[h.address]["role"] for h in net.hosts[1:3]} == {"prefill"}
            ports = {h.address: int(by_address[h.address]["data_address"].rpartition(":")[2])
                     for h in net.hosts[1:3]}  # fmt: skip
            # Each agent's answers to the other's fetches (from its data port): shaping all
            # of a host's traffic would put the acknowledgements of the other way's fetches
            # behind its slow queue.
            for (sender, receiver), rate_mbit in (((1, 2), 8), ((2, 1), 80)):
                source, destination = net.hosts[sender], net.hosts[receiver]
                port = ports[source.address]
                net.limit_rate_to(source, destination, rate_mbit, source_port=port)
            results = _replay(stack, tmp_path / "replay.jsonl", "0:1.5", "4")
            report = _settled_report(stack, len(results))
            links = get_json(f"{stack.base_url}/v1/links", stack.api_key)
        finally:
            stack.stop()
    _assert_none_lost(results, report)
    assert report["num_transferred_tokens"] > 0  # KV fetched from the other prefill agent
    assert isinstance(links, dict) and links["profile_bandwidth_bytes_per_s"] > 1e9
    measured = {
        (r["source"], r["destination"]): r["bandwidth_bytes_per_s"] for r in links["measured"]
    }
    believed = {
        pair: measured[pair] for pair in ((first, second), (second, first)) if pair in measured
    }
    assert believed, links  # at threshold 1 one agent fetched a hot prefix from the other
    if (first, second) in believed:  # 8 Mbit/s is 1 MB/s
        assert 0.25e6 < believed[(first, second)] < 2.5e6, believed
    if (second, first) in believed:  # 80 Mbit/s is 10 MB/s, less each fetch's fixed cost
        assert 2.5e6 < believed[(second, first)] < 25e6, believed


def _run_shaped(tmp_path: Path, shape) -> tuple[list[dict], dict, int]:
    """1P+1D, each in its namespace, the decode agent's link shaped by `shape(net, host)`:
    the replay's outcomes, the report, and the packets the link dropped."""
    with VirtualHosts(3, tag=_tag()) as net:
        stack = start_local_stack(
            tmp_path, num_prefill=1, num_decode=1, block_size=16, profile="tiny-cpu",
            hosts=net.hosts,
        )  # fmt: skip
        try:
            shape(net, net.hosts[2])
            results = _replay(stack, tmp_path / "replay.jsonl", "0:0.25", "2")
            return results, _settled_report(stack, len(results)), net.dropped_packets(net.hosts[2])
        finally:
            stack.stop()


def _assert_none_lost(results: list[dict], report: dict) -> None:
    ended = sum(
        report[k] or 0 for k in ("num_completed", "num_rejected", "num_failed", "num_cancelled")
    )
    assert results and ended == len(results) == report["num_requests"]
    assert report["num_completed"] > 0


def test_a_slow_decode_link_loses_no_request(tmp_path) -> None:
    """The KV hand-off and every streamed token cross a 20 Mbit/s link."""
    results, report, _ = _run_shaped(tmp_path, lambda net, host: net.limit_rate(host, 20))
    _assert_none_lost(results, report)


def test_a_decode_link_that_drops_packets_loses_no_request(tmp_path) -> None:
    """Packet loss without netem: a 10 Mbit/s link with a 2 ms queue drops what overflows it
    (every KV hand-off is a burst), so TCP retransmits and calls wait on their timeouts;
    every request still ends in one recorded state."""
    results, report, dropped = _run_shaped(
        tmp_path, lambda net, host: net.drop_overflow(host, 10, queue_ms=2)
    )
    assert dropped > 0  # the link did lose packets
    _assert_none_lost(results, report)


@pytest.mark.skipif(netem_missing_reason() is not None, reason=str(netem_missing_reason()))
def test_delay_and_loss_on_the_decode_link_lose_no_request(tmp_path) -> None:
    results, report, _ = _run_shaped(
        tmp_path, lambda net, host: net.netem(host, delay_ms=20, loss_percent=2)
    )
    _assert_none_lost(results, report)
