"""Measured links: a pair's fetches set its bandwidth in Algorithm 1's transfer branch, so a
slow link makes the core fetch less from behind it (backend.policy.links)."""

import pytest

from backend.policy import KvStored, PolicyConfig, RequestArrived, TransferMeasured
from backend.policy.links import LinkEstimates

from .helpers import LLAMA2_70B_KV_BYTES_PER_TOKEN, linear_cost, make_core

MB = 1_000_000


def test_an_estimate_follows_its_pair_measurements_beyond_the_latency() -> None:
    links = LinkEstimates(smoothing=0.5)
    assert links.seconds_per_byte("A", "B") is None  # never measured: the profile's
    assert links.observe("A", "B", 100 * MB, 1.01, latency_s=0.01)
    assert links.seconds_per_byte("A", "B") == pytest.approx(1 / (100 * MB))
    assert links.observe("A", "B", 100 * MB, 3.01, latency_s=0.01)  # it slowed down
    assert links.seconds_per_byte("A", "B") == pytest.approx(0.5 * (1 + 3) / (100 * MB))
    assert links.seconds_per_byte("B", "A") is None  # each direction is its own link
    (row,) = links.snapshot()
    assert row["source"] == "A" and row["num_measurements"] == 2
    assert row["bandwidth_bytes_per_s"] == pytest.approx(50 * MB)


def test_small_self_and_malformed_fetches_are_not_measurements() -> None:
    links = LinkEstimates()
    assert not links.observe("A", "B", 100, 1.0, latency_s=0.0)  # per-call overheads
    assert not links.observe("A", "A", 100 * MB, 1.0, latency_s=0.0)
    assert not links.observe("A", "B", 100 * MB, float("nan"), latency_s=0.0)
    assert links.snapshot() == []
    # Faster than the latency: all of it was latency, none bandwidth.
    assert links.observe("A", "B", 100 * MB, 0.001, latency_s=0.01)
    assert links.seconds_per_byte("A", "B") == 0.0
    assert links.snapshot()[0]["bandwidth_bytes_per_s"] is None


def test_a_leaving_instance_takes_its_links_along() -> None:
    links = LinkEstimates()
    for pair in (("A", "B"), ("B", "C"), ("C", "A")):
        links.observe(*pair, 100 * MB, 1.0, latency_s=0.0)
    links.forget("A")
    assert [(r["source"], r["destination"]) for r in links.snapshot()] == [("B", "C")]


def _slow_fetch(source: str, destination: str) -> TransferMeasured:
    """40 blocks of 16 tokens in 30 s: about 7 MB/s, where the profile says 100 GB/s."""
    num_bytes = 640 * LLAMA2_70B_KV_BYTES_PER_TOKEN
    return TransferMeasured(0.0, source, destination, num_bytes, 30.0)


def test_a_slow_link_makes_the_core_fetch_from_behind_it_less() -> None:
    config = PolicyConfig(block_size=16, kvcache_balancing_threshold=1.0, rejection_policy="none")
    core = make_core(config, linear_cost(), prefill=("A", "B", "C"), decode=("D",))
    keys = tuple(range(1, 41))
    core.handle(KvStored(0.0, "A", keys))
    core.prefill["A"].enqueue("busy", 5.0)  # A is busy: the others fetch its prefix
    core.prefill["C"].enqueue("busy", 0.01)  # C a little less idle than B

    dispatch, _replicate = core.handle(RequestArrived(0.0, "r1", keys, 640, 1))
    assert dispatch.instance_id == "B" and dispatch.plan.fetch.source_instance_id == "A"
    assert dispatch.estimated_transfer_s < 0.01  # 210 MB at 100 GB/s

    core.handle(_slow_fetch("A", "B"))  # B's fetch from A crawled
    dispatch, _replicate = core.handle(RequestArrived(0.0, "r2", keys, 640, 1))
    assert dispatch.instance_id == "C" and dispatch.plan.fetch.source_instance_id == "A"

    # C's too: queueing 5 s behind A's work beats fetching its prefix for 30 s.
    core.handle(_slow_fetch("A", "C"))
    (dispatch,) = core.handle(RequestArrived(0.0, "r3", keys, 640, 1))
    assert dispatch.instance_id == "A" and dispatch.plan.fetch is None
    estimates = {e.instance_id: e for e in dispatch.candidates}
    assert estimates["B"].transfer_s == pytest.approx(30.0, rel=0.01)


def test_the_fastest_holder_serves_a_fetch() -> None:
    config = PolicyConfig(block_size=16, kvcache_balancing_threshold=1.0, rejection_policy="none")
    core = make_core(config, linear_cost(), prefill=("A", "B", "C"), decode=("D",))
    keys = tuple(range(1, 41))
    for holder in ("A", "B"):
        core.handle(KvStored(0.0, holder, keys))
        core.prefill[holder].enqueue("busy", 100.0)
    core.handle(_slow_fetch("A", "C"))  # A is the first holder, but its link to C is slow
    dispatch, _replicate = core.handle(RequestArrived(0.0, "r1", keys, 640, 1))
    assert dispatch.instance_id == "C" and dispatch.plan.fetch.source_instance_id == "B"
