"""Cache page: the hottest blocks (hits, replicas, holders), each agent's pool occupancy by
tier (GET /v1/cache), the hit ratio achieved against the reachable one, and KV transfers and
replications over the chosen window (GET /v1/report)."""

import streamlit as st

from console import charts
from console import format as fmt
from console.connection import BackendError, client, show_error
from console.widgets import chart, metric_row, refreshed_window_panel, table

HOT_BLOCKS_LIMIT = 20


def cache_panel(window_s: float) -> None:
    backend = client()
    try:
        cache = backend.cache(limit=HOT_BLOCKS_LIMIT)
        report = backend.report(window_s=window_s)
    except BackendError as error:
        show_error(error, "cannot read the cache")
        return
    metric_row(
        {**report, "num_indexed_blocks": cache["num_indexed_blocks"]},
        [
            ("Indexed blocks", "num_indexed_blocks"),
            ("Hit ratio (tokens)", "cache_hit_ratio"),
            ("Hit ratio (blocks)", "block_hit_ratio"),
            ("Reachable hit ratio", "reachable_hit_ratio"),
            ("Transferred tokens", "num_transferred_tokens"),
            ("Replicated blocks", "num_replicated_blocks"),
        ],
        {
            "reachable_hit_ratio": "The best prefix held anywhere in the pool at decision time.",
            "num_indexed_blocks": "Blocks in the Conductor's global prefix index, all shards.",
        },
    )
    hot_blocks = cache["hot_blocks"]
    left, right = st.columns([3, 2])
    with left:
        st.markdown(f"**Hottest blocks** (top {HOT_BLOCKS_LIMIT} by hits)")
        table(
            [
                {
                    "key": block["key"],
                    "depth": block["depth"],
                    "hits": block["hits"],
                    "replicas": block["num_replicas"],
                    "holders": charts.holders_text(block["holders"]),
                }
                for block in hot_blocks
            ],
            ["key", "depth", "hits", "replicas", "holders"],
        )
    with right:
        if hot_blocks:
            chart(charts.hot_blocks_figure(hot_blocks), "cache-hot")
        else:
            st.info("No block has been reused yet.")
    st.markdown("**Pool occupancy per agent**")
    instances = cache["instances"]
    table(
        [
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
            for pool in instances
        ]
    )
    left, right = st.columns(2)
    with left:
        chart(charts.occupancy_figure(instances), "cache-occupancy")
    with right:
        chart(charts.hit_ratio_figure(report), "cache-hit-ratio")
    chart(charts.transfers_figure(report), "cache-transfers")


st.title("Cache")
refreshed_window_panel(cache_panel, key="cache_refresh")
