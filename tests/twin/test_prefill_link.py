"""A prefill instance's outgoing link: bytes one transfer at a time, per-fetch costs beside;
and a prefill's turn on its worker, which holds its fetch as live's does."""

import pytest
import simpy

from backend.policy.effects import CachePlan, FetchSpan
from twin.prefill import PrefillInstance, PrefillJob
from twin.shard import PoolShard
from twin.timing import load_timing


def _instance(
    env: simpy.Environment,
    latency_s: float,
    bandwidth: float,
    name: str = "p0",
    events: list[tuple[str, str, float]] | None = None,
) -> PrefillInstance:
    timing = load_timing("tiny-cpu")
    timing.link_latency_s = latency_s
    timing.link_bandwidth_bytes_per_s = bandwidth
    seen = events if events is not None else []
    return PrefillInstance(
        env,
        name,
        timing,
        PoolShard(name, 64, 0, "lru"),
        block_size=16,
        chunk_tokens=4096,
        on_started=lambda job: seen.append(("started", job.request_id, env.now)),
        on_kv_events=lambda events: None,
        on_finished=lambda job: seen.append(("finished", job.request_id, env.now)),
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


def test_a_prefill_fetches_on_its_worker_s_turn() -> None:
    """Live's agent fetches the blocks its plan names while it holds its prefill worker
    (the fetch is part of the seconds it measures), so the next prefill in its line waits
    for the fetch too, and a fetch does not run while its prefill waits in line. Two jobs
    at once, the first fetching 10 blocks from another instance: the first starts at once
    and fetches, then computes; the second starts when both are done; the first's measured
    seconds (`worked_s`) are its fetch and its compute."""
    env = simpy.Environment()
    events: list[tuple[str, str, float]] = []
    holder = _instance(env, 0.005, 100e6, "p1")
    instance = _instance(env, 0.005, 100e6, "p0", events)
    timing = instance.timing
    keys = tuple(range(10))
    holder.shard.store(keys, 0.0)
    first = PrefillJob(
        "a", 320, tuple(range(20)), CachePlan((), FetchSpan("p1", keys), 160, 160), holder
    )
    second = PrefillJob("b", 160, tuple(range(100, 110)), CachePlan((), None, 0, 160))
    instance.submit(second)  # first in line: the other's fetch waits for its turn
    instance.submit(first)
    env.run()
    fetch_s = timing.transfer_s(10 * 16 * timing.kv_bytes_per_token)
    second_s = timing.prefill_s(160, 0)
    assert first.fetch_s == pytest.approx(fetch_s)
    assert first.compute_s == pytest.approx(timing.prefill_s(320, 160))
    assert first.worked_s == pytest.approx(fetch_s + first.compute_s)
    assert second.worked_s == pytest.approx(second_s)
    assert events == [
        ("started", "b", 0.0),
        ("finished", "b", pytest.approx(second_s)),
        ("started", "a", pytest.approx(second_s)),
        ("finished", "a", pytest.approx(second_s + first.worked_s)),
    ]
