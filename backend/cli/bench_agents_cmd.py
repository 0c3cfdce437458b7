"""`kvcentric bench layerwise|prefix-reuse|decode|pool|transport`: the node agents' figures.

Each command imports torch (or the transport) only when it runs, so the rest of the
command line starts fast.
"""

import json
from pathlib import Path
from typing import Any

import typer

from backend.cli.bench_cmd import _print_table, _stderr, bench_app


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


@bench_app.command("allocator")
def allocator(
    preset: str = typer.Option("tiny", "--preset", help="Model preset."),
    calls: int = typer.Option(160, "--calls", min=60, help="Prefills per variant."),
    threads: int = typer.Option(16, "--threads", min=1, help="Threads taking turns."),
    as_json: bool = _json_option(),
) -> None:
    """A young agent's prefill CPU time per token, first calls against steady, with glibc's
    default allocator and with the agent's (agents/node/allocator.py); each in a fresh
    process, calls taken in turn by a pool of threads as gRPC serves them."""
    from agents.bench.allocator import allocator_benchmark

    result = allocator_benchmark(preset, num_calls=calls, num_threads=threads)
    _report("allocator", result, as_json)


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
    netns: bool = typer.Option(
        False,
        "--netns",
        help="Also across network namespaces: the serving process on a virtual host of its "
        "own (a namespace, a veth pair and a bridge; needs root), in the same run as "
        "loopback; across_* figures and across_vs_loopback = across / loopback ours_gbps.",
    ),
    as_json: bool = _json_option(),
) -> None:
    """Move a batch of KV blocks between two processes on loopback: our TCP transport, a
    plain socket sendall/recv_into loop (the baseline) and Mooncake when installed.
    ours_gbps, socket_gbps, mooncake_gbps are gigabits per second; ratio = ours / socket."""
    from dataclasses import asdict

    from agents.transport.bench import run_transport_bench

    result = asdict(run_transport_bench(num_blocks, block_bytes, repeats))
    if netns:
        from backend.bench.netns import VirtualHosts

        try:
            with VirtualHosts(1, tag="b") as net:
                host = net.hosts[0]
                across = run_transport_bench(
                    num_blocks,
                    block_bytes,
                    repeats,
                    serve_netns=host.name,
                    serve_address=host.address,
                )
        except RuntimeError as error:
            typer.echo(f"error: --netns: {error}", err=True)
            raise typer.Exit(2) from None
        result["across_ours_gbps"] = across.ours_gbps
        result["across_socket_gbps"] = across.socket_gbps
        result["across_ratio"] = across.ratio
        result["across_vs_loopback"] = across.ours_gbps / result["ours_gbps"]
    _report("KV data plane", result, as_json)


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


@bench_app.command("against-transformers")
def against_transformers(
    model: str = typer.Option("smollm2-135m", "--model", help="A real model or checkpoint path."),
    prefill_tokens: str = typer.Option("512,2048,4096", "--prefill-tokens", help="Prompt sizes."),
    batch_sizes: str = typer.Option("1,2,4,8,16,32", "--batch-sizes", help="Decode batches."),
    context_tokens: int = typer.Option(256, "--context", min=1, help="Context per request."),
    as_json: bool = _json_option(),
) -> None:
    """Prefill tokens/s and decode step time of our workers against transformers' forward on
    the same real model, inputs and threads, in one process (ratio > 1: ours is faster),
    and the resident memory the model costs an agent."""
    from agents.bench.against_transformers import against_transformers_benchmark

    try:
        sizes = tuple(int(part) for part in prefill_tokens.split(","))
        batches = tuple(int(part) for part in batch_sizes.split(","))
    except ValueError:
        typer.echo("error: --prefill-tokens and --batch-sizes are comma-separated integers")
        raise typer.Exit(2) from None
    try:
        result = against_transformers_benchmark(
            model, prefill_tokens=sizes, batch_sizes=batches, context_tokens=context_tokens
        )
    except ValueError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(result))
        return
    rows = {
        **{
            f"prefill {p['tokens']} tokens (tokens/s ours / transformers)": (
                f"{p['ours_tokens_per_s']:.0f} / {p['transformers_tokens_per_s']:.0f} "
                f"(ratio {p['ratio']:.2f})"
            )
            for p in result["prefill"]
        },
        **{
            f"decode step, batch {d['batch_size']} (ms ours / transformers)": (
                f"{d['ours_s'] * 1e3:.1f} / {d['transformers_s'] * 1e3:.1f} "
                f"(ratio {d['ratio']:.2f})"
            )
            for d in result["decode"]
        },
        "model resident memory (MiB)": f"{result['model_rss_bytes'] / 2**20:.0f}",
    }
    _print_table(f"{model}: ours against transformers", rows)


@bench_app.command("host-drift")
def host_drift(
    preset: str = typer.Option("tiny", "--preset", help="Model preset of the decode probe."),
    duration_s: float = typer.Option(90.0, "--duration-s", min=0.1, help="Seconds measured."),
    window_s: float = typer.Option(
        7.5,
        "--window-s",
        min=0.01,
        help="Window length: the warm-up a calibration has (7.5 s is a minute at speed 8).",
    ),
    as_json: bool = _json_option(),
) -> None:
    """How steady this host's speed is: a decode step of the agents' model, a matrix product
    in cache and a memory copy, called in turn on one thread; per probe, each window's mean
    CPU time per call against the run's, and how far a window's mean is from the next two
    windows' (the noise floor of a twin calibrated from a warm-up of that length). Run it
    with nothing else running."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from agents.bench.host_drift import PROBES, count_windows, host_drift_benchmark

    try:
        count_windows(duration_s, window_s)
    except ValueError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    progress = Progress(TextColumn("host drift"), BarColumn(), TimeElapsedColumn(), console=_stderr)
    with progress:
        task = progress.add_task("host drift", total=duration_s)
        result = host_drift_benchmark(
            preset,
            duration_s=duration_s,
            window_s=window_s,
            on_progress=lambda done_s: progress.update(task, completed=done_s),
        )
        progress.update(task, completed=duration_s)
    if as_json:
        typer.echo(json.dumps(result))
        return
    rows = {
        f"{probe} ({result[probe]['mean_ms']:.3f} ms a call)": (
            f"windows {min(result[probe]['windows']):.2f}-{max(result[probe]['windows']):.2f}x "
            f"the mean; next two windows missed by {result[probe]['median_abs_err']:.1%} "
            f"median, {result[probe]['max_abs_err']:.1%} worst, "
            f"{result[probe]['share_over_10pct']:.0%} over 10 %"
        )
        for probe in PROBES
    }
    _print_table(
        f"host drift: {result['num_windows']} windows of {window_s:g} s on one thread", rows
    )
