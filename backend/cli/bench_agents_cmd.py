"""`kvcentric bench layerwise|prefix-reuse|decode|pool|transport`: the node agents' figures.

Each command imports torch (or the transport) only when it runs, so the rest of the
command line starts fast.
"""

import json
from pathlib import Path
from typing import Any

import typer

from backend.cli.bench_cmd import _print_table, bench_app


def _report(title: str, result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(result))
        return
    flat = {key: value for key, value in result.items() if not isinstance(value, list | dict)}
    _print_table(title, flat)


def _json_option() -> bool:
    return typer.Option(False, "--json", help="Print one JSON object on stdout.")


@bench_app.command("layerwise")
def layerwise(
    preset: str = typer.Option("tiny", "--preset", help="Model preset."),
    context_tokens: int = typer.Option(8192, "--context", min=1, help="Prompt tokens."),
    store_bytes_per_s: float | None = typer.Option(
        None, "--store-bytes-per-s", help="Simulate a slower store tier (bytes/s)."
    ),
    as_json: bool = _json_option(),
) -> None:
    """Layer-wise prefill vs compute-then-store: compute_s, serialized_s, layerwise_s and
    hidden_share, the share of the store time the layer-wise schedule hides."""
    from agents.bench.layerwise import layerwise_benchmark

    result = layerwise_benchmark(preset, context_tokens, store_bytes_per_s=store_bytes_per_s)
    _report("layer-wise prefill", result, as_json)


@bench_app.command("prefix-reuse")
def prefix_reuse(
    preset: str = typer.Option("tiny", "--preset", help="Model preset."),
    context_tokens: int = typer.Option(4096, "--context", min=1, help="Prompt tokens."),
    cached_share: float = typer.Option(0.75, "--cached-share", help="Share of the prompt reused."),
    as_json: bool = _json_option(),
) -> None:
    """Prefill time with a cached prefix against none (ratio and speedup)."""
    from agents.bench.workers import prefix_reuse_benchmark

    result = prefix_reuse_benchmark(preset, context_tokens, cached_share=cached_share)
    _report("prefix reuse", result, as_json)


@bench_app.command("decode")
def decode(
    preset: str = typer.Option("tiny", "--preset", help="Model preset."),
    as_json: bool = _json_option(),
) -> None:
    """Decode step time over batch sizes 1..64 and per-request contexts, with its fit."""
    from agents.bench.workers import decode_benchmark

    _report("decode step", decode_benchmark(preset), as_json)


@bench_app.command("pool")
def pool(
    block_bytes: int = typer.Option(
        1 << 20, "--block-bytes", min=1, help="Bytes per KV block (tiny, 512 tokens: 1 MiB)."
    ),
    ssd_root: Path | None = typer.Option(None, "--ssd-dir", help="Where the SSD tier lives."),
    as_json: bool = _json_option(),
) -> None:
    """Store and load microseconds per block in the pool shard's DRAM and SSD tiers."""
    from agents.pool.bench import bench_pool

    _report("pool shard", bench_pool(block_bytes, ssd_root=ssd_root), as_json)


@bench_app.command("transport")
def transport(
    num_blocks: int = typer.Option(64, "--blocks", min=1, help="Blocks per batch."),
    block_bytes: int = typer.Option(1 << 20, "--block-bytes", min=1, help="Bytes per block."),
    repeats: int = typer.Option(5, "--repeat", min=1, help="Repeats; figures are medians."),
    as_json: bool = _json_option(),
) -> None:
    """Move a batch of KV blocks between two processes on loopback: our TCP transport, a
    plain socket sendall/recv_into loop (the baseline) and Mooncake when installed.
    ours_gbps, socket_gbps, mooncake_gbps are gigabits per second; ratio = ours / socket."""
    from dataclasses import asdict

    from agents.transport.bench import run_transport_bench

    result = run_transport_bench(num_blocks, block_bytes, repeats)
    _report("KV data plane", asdict(result), as_json)


@bench_app.command("pipeline")
def pipeline(
    preset: str = typer.Option("tiny", "--preset", help="Model preset."),
    context_tokens: int = typer.Option(4096, "--context", min=1, help="Prompt tokens."),
    num_stages: int = typer.Option(2, "--stages", min=1, help="Pipeline stages (processes)."),
    chunk_tokens: int = typer.Option(512, "--chunk", min=1, help="prefill_chunk_tokens."),
    as_json: bool = _json_option(),
) -> None:
    """Chunked pipeline prefill across stage processes against one agent holding every
    layer, in the same processes: single_agent_s, pipelined_s and speedup."""
    from agents.workers.pipeline_bench import pipeline_benchmark

    result = pipeline_benchmark(
        preset, context_tokens, num_stages, prefill_chunk_tokens=chunk_tokens
    )
    _report("chunked pipeline prefill", result, as_json)
