"""A prefill instance's outgoing link: bytes one transfer at a time, per-fetch costs beside."""

import pytest
import simpy

from twin.prefill import PrefillInstance
from twin.shard import PoolShard
from twin.timing import load_timing


def _instance(env: simpy.Environment, latency_s: float, bandwidth: float) -> PrefillInstance:
    timing = load_timing("tiny-cpu")
    timing.link_latency_s = latency_s
    timing.link_bandwidth_bytes_per_s = bandwidth
    return PrefillInstance(
        env,
        "p0",
        timing,
        PoolShard("p0", 16, 0, "lru"),
        block_size=16,
        chunk_tokens=4096,
        on_started=lambda job: None,
        on_kv_events=lambda events: None,
        on_finished=lambda job: None,
    )


def test_transfers_queue_for_the_bytes_and_overlap_their_latency() -> None:
    """Three 1 MB transfers at once over 100 MB/s with 5 ms each of per-fetch cost: the bytes
    go one after another (10, 20, 30 ms), each latency after its bytes; a link that held
    the latency too would end them at 15, 30 and 45 ms."""
    env = simpy.Environment()
    source = _instance(env, latency_s=0.005, bandwidth=100e6)
    ends: list[float] = []
    seconds: list[float] = []

    def fetch():
        seconds.append((yield from source.send(1_000_000)))
        ends.append(env.now)

    for _ in range(3):
        env.process(fetch())
    env.run()
    assert ends == pytest.approx([0.015, 0.025, 0.035])
    assert seconds == pytest.approx([0.015] * 3)  # each transfer's own, its turn not counted
