"""The pool benchmark runs and returns positive per-block times for every tier."""

from agents.pool.bench import bench_pool


def test_bench_pool_reports_every_tier(tmp_path):
    figures = bench_pool(4096, num_blocks=8, num_blocks_per_call=4, ssd_root=tmp_path)
    assert figures["block_bytes"] == 4096
    for name in ("dram_store", "dram_load", "ssd_demote", "ssd_load", "ssd_promote"):
        assert figures[f"{name}_us_per_block"] > 0
    assert figures["checksum_gb_per_s"] > 0
    assert list(tmp_path.iterdir()) == []  # its SSD directory is cleaned up
