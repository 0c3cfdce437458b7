"""The worker benchmarks run end to end at toy sizes and report the fields the CLI prints."""

from agents.bench import decode_benchmark, layerwise_benchmark, prefix_reuse_benchmark


def test_layerwise_benchmark_reports_its_fields():
    result = layerwise_benchmark(context_tokens=512, block_size=128, num_repeats=1)
    for name in ("compute_s", "serialized_s", "layerwise_s", "store_s", "exposed_store_s"):
        assert result[name] >= 0
    assert result["kv_bytes"] == 512 * 2048
    assert result["hidden_share"] <= 1.0


def test_prefix_reuse_benchmark_caches_three_quarters():
    result = prefix_reuse_benchmark(context_tokens=256, block_size=32, num_repeats=1)
    assert result["cached_tokens"] == 192
    assert 0 < result["flops_ratio"] < 1
    assert result["ratio"] > 0


def test_decode_benchmark_covers_its_grid_and_fits_it():
    result = decode_benchmark(batch_sizes=(1, 2, 4), context_tokens=(32, 64), num_steps=2)
    cells = {(p["batch_size"], p["context_tokens"]) for p in result["points"]}
    assert cells == {(b, c) for b in (1, 2, 4) for c in (32, 64)}
    assert set(result["fit"]) == {"fixed_s", "per_request_s", "per_context_token_s"}
