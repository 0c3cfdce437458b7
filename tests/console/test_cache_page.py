"""The Cache page against the real backend: hot blocks and pool occupancy are GET /v1/cache's,
hit ratios and transfers GET /v1/report's."""

from console import format as fmt
from tests.console.conftest import NUM_COMPLETED
from tests.console.pages import errors, metrics, num_charts, open_page, shown_as_in


def test_the_hottest_blocks_are_the_backends(app, backend):
    open_page(app, "cache")
    cache = backend.get("/v1/cache", limit=20)
    hot = app.dataframe[0].value.to_dict("records")
    assert [(r["key"], r["depth"], r["hits"], r["replicas"]) for r in hot] == [
        (b["key"], b["depth"], b["hits"], b["num_replicas"]) for b in cache["hot_blocks"]
    ]
    # The fixture's shared two-block prefix: cached by the first request, reused by the rest.
    shared = [r for r in hot if r["hits"] >= NUM_COMPLETED - 1]
    assert {r["depth"] for r in shared} >= {0, 1}
    prefill = next(p["instance_id"] for p in cache["instances"] if p["role"] == "prefill")
    assert hot[0]["holders"] == f"{prefill} (dram)"


def test_pool_occupancy_per_agent_and_tier_is_the_backends(app, backend):
    open_page(app, "cache")
    cache = backend.get("/v1/cache", limit=20)
    rows = app.dataframe[1].value.to_dict("records")
    assert rows == [
        {
            "agent": pool["instance_id"],
            "role": pool["role"],
            "DRAM blocks": pool["dram_blocks"],
            "DRAM used": fmt.data_size(pool["dram_bytes"]),
            "DRAM capacity": fmt.data_size(pool["dram_capacity_bytes"]),
            "SSD blocks": pool["ssd_blocks"],
            "SSD used": fmt.data_size(pool["ssd_bytes"]),
            "SSD capacity": fmt.data_size(pool["ssd_capacity_bytes"]),
        }
        for pool in cache["instances"]
    ]
    assert any(row["DRAM blocks"] > 0 for row in rows)


def test_hit_ratios_achieved_and_reachable_are_the_reports(app, backend):
    before = backend.get("/v1/report", window_s=300.0)
    shown = metrics(open_page(app, "cache"))
    report = backend.get("/v1/report", window_s=300.0)
    cache = backend.get("/v1/cache", limit=20)
    assert shown["Indexed blocks"] == fmt.count(cache["num_indexed_blocks"])
    for label, key in {
        "Hit ratio (tokens)": "cache_hit_ratio",
        "Hit ratio (blocks)": "block_hit_ratio",
        "Reachable hit ratio": "reachable_hit_ratio",
        "Transferred tokens": "num_transferred_tokens",
        "Replicated blocks": "num_replicated_blocks",
    }.items():
        assert shown_as_in(shown[label], key, [before, report]), label
    assert report["cache_hit_ratio"] > 0
    # Hot blocks, occupancy, hit ratio, transfers over time.
    assert num_charts(app) == 4
    assert not errors(app)
