"""`kvcentric bench ...`: benchmarks of the policy core and block hashing."""

import itertools
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from backend.bench.hashing import measure_hashing
from backend.bench.policy_replay import DEFAULT_CACHE_CAPACITY_BLOCKS, ReplayResult, replay_trace
from backend.cli.children import AGENT_NICE
from backend.policy.config import PrefillScheduler, RejectionPolicy
from backend.traces import SHIPPED_TRACE
from backend.traces.loader import TraceError, iter_trace

bench_app = typer.Typer(
    help="Benchmarks whose figures go in docs/benchmarks.md.", no_args_is_help=True
)

_stderr = Console(stderr=True)


def _print_table(title: str, rows: dict[str, Any]) -> None:
    table = Table(title=title, show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    for name, value in rows.items():
        shown = f"{value:,.3f}" if isinstance(value, float) else str(value)
        table.add_row(name, shown)
    Console().print(table)


@bench_app.command("hashing")
def hashing(
    block_size: int = typer.Option(512, "--block-size", min=1, help="Tokens per block."),
    num_tokens: int = typer.Option(
        32 * 1024 * 1024, "--tokens", min=1, help="Tokens hashed per repeat, over all prompts."
    ),
    num_repeats: int = typer.Option(5, "--repeat", min=1, help="Repeats; speeds are medians."),
    num_prompts: int = typer.Option(8, "--prompts", min=1, help="Prompts the tokens are cut into."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
) -> None:
    """Chained block hashing (block_keys) in tokens/s, against one plain xxh3_64 pass."""
    try:
        result = measure_hashing(
            num_tokens=num_tokens,
            block_size=block_size,
            num_repeats=num_repeats,
            num_prompts=num_prompts,
        )
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    if as_json:
        typer.echo(json.dumps(asdict(result)))
    else:
        _print_table("block hashing (tokens/s are medians)", asdict(result))


@bench_app.command("policy")
def policy(
    trace: Path = typer.Option(
        SHIPPED_TRACE, "--trace", dir_okay=False, help="Mooncake-format JSONL trace."
    ),
    num_prefill: int = typer.Option(16, "--prefill", min=1, help="Prefill instances."),
    num_decode: int = typer.Option(16, "--decode", min=1, help="Decode instances."),
    scheduler: PrefillScheduler = typer.Option("kvcache-centric", "--scheduler"),
    rejection: RejectionPolicy = typer.Option("early-predicted", "--rejection"),
    baseline_scheduler: PrefillScheduler = typer.Option(
        "load-balancing", "--baseline-scheduler", help="Scheduler of the same-run baseline replay."
    ),
    limit: int | None = typer.Option(
        None, "--limit", min=1, help="Replay only the trace's first N requests."
    ),
    cache_blocks: int = typer.Option(
        DEFAULT_CACHE_CAPACITY_BLOCKS, "--cache-blocks", min=1, help="LRU blocks per prefill shard."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
) -> None:
    """Replay a trace through ConductorCore with no I/O: decisions/s and decision latency."""
    try:
        rows = list(itertools.islice(iter_trace(trace), limit))
    except (TraceError, OSError) as error:
        _stderr.print(f"[red]error:[/red] {error}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    runs: dict[str, PrefillScheduler] = {"measured": scheduler, "baseline": baseline_scheduler}
    results: dict[str, ReplayResult] = {}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=_stderr, auto_refresh=False) as progress:
        for role, run_scheduler in runs.items():
            task = progress.add_task(f"{role} ({run_scheduler})", total=len(rows))

            def advance(num_requests: int, task: Any = task) -> None:
                progress.update(task, advance=num_requests, refresh=True)

            results[role] = replay_trace(
                rows,
                num_prefill_instances=num_prefill,
                num_decode_instances=num_decode,
                scheduler=run_scheduler,
                rejection_policy=rejection,
                cache_capacity_blocks=cache_blocks,
                on_progress=advance,
            )
    measured, baseline = results["measured"], results["baseline"]
    report = {
        **asdict(measured),
        "driver_s": measured.driver_s,
        "is_drained": measured.is_drained,
        "trace": str(trace),
        "baseline": {
            "scheduler": baseline.scheduler,
            "decisions_per_s": baseline.decisions_per_s,
            "p50_us": baseline.p50_us,
            "p99_us": baseline.p99_us,
            "num_accepted": baseline.num_accepted,
            "is_drained": baseline.is_drained,
        },
        "ratio_to_baseline": (
            measured.decisions_per_s / baseline.decisions_per_s if baseline.decisions_per_s else 0.0
        ),
    }
    if as_json:
        typer.echo(json.dumps(report))
        return
    shown = {k: v for k, v in report.items() if not isinstance(v, dict)}
    shown["rejected_by_reason"] = json.dumps(measured.rejected_by_reason)
    for name, seconds in measured.core_s_by_event.items():
        shown[f"core_s {name}"] = seconds
    shown["baseline decisions_per_s"] = baseline.decisions_per_s
    shown["baseline p99_us"] = baseline.p99_us
    _print_table(f"policy replay of {trace.name}", shown)


@bench_app.command("twin")
def twin_speed(
    trace: Path = typer.Option(
        SHIPPED_TRACE, "--trace", exists=True, dir_okay=False, help="Mooncake-format JSONL trace."
    ),
    num_prefill: int = typer.Option(8, "--prefill", min=1, help="Prefill instances."),
    num_decode: int = typer.Option(8, "--decode", min=1, help="Decode instances."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
) -> None:
    """Wall time of a whole-trace twin run (paper profile), and how much faster than real
    time it is, against the policy-only replay of the same trace."""
    from backend.bench.twin_speed import measure_twin_speed  # the twin loads SimPy

    try:
        result = measure_twin_speed(trace, num_prefill=num_prefill, num_decode=num_decode)
    except (TraceError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(asdict(result)))
    else:
        _print_table("twin speed", asdict(result))


@bench_app.command("admission")
def admission(
    duration_s: float = typer.Option(10.0, "--duration-s", min=0.1, help="Seconds measured."),
    concurrency: int = typer.Option(
        4, "--concurrency", min=1, help="Concurrent keep-alive connections (closed loop)."
    ),
    num_prefill: int = typer.Option(1, "--prefill", min=1, help="Prefill agents (tiny)."),
    num_decode: int = typer.Option(1, "--decode", min=1, help="Decode agents (tiny)."),
    endpoint: str = typer.Option(
        "completions", "--endpoint", help="completions (/v1/completions) or native."
    ),
    prompt_tokens: int = typer.Option(1024, "--prompt-tokens", min=1, help="Tokens a prompt."),
    warmup_s: float = typer.Option(1.0, "--warmup-s", min=0.0, help="Unrecorded warm-up."),
    log_level: str = typer.Option(
        "info", "--log-level", help="The Conductor's log level (info logs each request)."
    ),
    client: str = typer.Option(
        "httpx",
        "--client",
        help="httpx (asyncio workers in this process; reads every answer) or wrk (C, one "
        "thread: a fraction of the CPU per request, so hundreds of connections measure the "
        "server, not the client; the database says whether each was rejected early).",
    ),
    load: str = typer.Option(
        "rejected",
        "--load",
        help="rejected: a TTFT SLO no prefill can meet, clients send back to back, every "
        "answer a 429 (the saturated rejection path). mixed: the cluster at its own SLOs "
        "serves what it admits while closed-loop clients think --think-s between requests "
        "and a prober times GET /healthz every 0.1 s (rejections while serving).",
    ),
    think_s: float = typer.Option(
        1.0,
        "--think-s",
        min=0.001,
        help="--load mixed: each client's mean pause between an answer and its next request "
        "(drawn from 0.5x-1.5x).",
    ),
    agent_cpus: str | None = typer.Option(
        None,
        "--agent-cpus",
        help="--load mixed: pin the agents to these CPUs (taskset's list, e.g. 1), leaving "
        "the others to the Conductor and the clients, as if the agents had hosts of their "
        "own. Default: everything shares every core.",
    ),
    agent_nice: int = typer.Option(
        AGENT_NICE,
        "--agent-nice",
        min=0,
        max=19,
        help="--load mixed: the agents' nice value (the Conductor runs at 0), as `kvcentric up` "
        "starts them: they yield a shared core to the Conductor. 0: all equal.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
) -> None:
    """The admission path under overload: starts its own Conductor (SQLite) and tiny agents
    and posts requests from concurrent keep-alive clients. --load rejected (the default) sets
    a TTFT SLO no prefill can meet: every request must be rejected early (429, stage
    admission); reports rps and latency percentiles, and GET /healthz on the same client as
    the same-run baseline. --load mixed: the latency of 429s, served answers and /healthz
    while the cluster also serves (e.g. --concurrency 200 --duration-s 20)."""
    from backend.bench.admission import ENDPOINTS, run_admission_bench

    if endpoint not in ENDPOINTS:
        raise typer.BadParameter(f"choose one of {', '.join(ENDPOINTS)}", param_hint="--endpoint")
    if load not in ("rejected", "mixed"):
        raise typer.BadParameter("choose rejected or mixed", param_hint="--load")
    # The options both loads share; each adds its own.
    common: dict[str, Any] = {
        "duration_s": duration_s,
        "concurrency": concurrency,
        "num_prefill": num_prefill,
        "num_decode": num_decode,
        "endpoint": endpoint,
        "prompt_tokens": prompt_tokens,
        "warmup_s": warmup_s,
        "log_level": log_level,
    }
    if load == "mixed":
        _mixed_load(
            **common,
            think_s=think_s,
            agent_cpus=agent_cpus,
            agent_nice=agent_nice,
            as_json=as_json,
        )
        return
    report = _stack_report(run_admission_bench, **common, client=client)
    if as_json:
        typer.echo(json.dumps(report))
        return
    shown = {k: v for k, v in report.items() if not isinstance(v, dict)}
    shown["other_statuses"] = json.dumps(report["other_statuses"])
    shown["health rps"] = report["health"]["rps"]
    shown["health p99_ms"] = report["health"]["p99_ms"]
    shown["cores_used"] = json.dumps(report["cores_used"])
    _print_table("admission path under overload", shown)


def _stack_report(run: Any, **options: Any) -> dict[str, Any]:
    """Run a benchmark that starts a stack of its own, its progress on stderr; a bad option
    exits 2 with its message, a stack that does not start exits 1."""
    from backend.cli.children import EXIT_INTERRUPTED, ChildFailed, stop_on_signals

    stop_on_signals()  # Ctrl-C or SIGTERM stop the stack it started too
    try:
        return run(
            **options, on_status=lambda line: _stderr.print(line, highlight=False, soft_wrap=True)
        )
    except KeyboardInterrupt:
        _stderr.print("[red]error:[/red] interrupted; the stack it started is stopped")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except ValueError as error:
        _stderr.print(f"[red]error:[/red] {error}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except ChildFailed as error:
        _stderr.print(f"[red]error:[/red] {error}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


def _mixed_load(*, as_json: bool, **options: Any) -> None:
    """`bench admission --load mixed` (backend/bench/mixed_load.py)."""
    from backend.bench.mixed_load import run_mixed_bench

    report = _stack_report(run_mixed_bench, **options)
    if as_json:
        typer.echo(json.dumps(report))
        return
    shown: dict[str, Any] = {}
    for name in ("rejected_early", "served", "health"):
        phase = report[name]
        shown[f"{name}: count"] = phase["num_requests"]
        shown[f"{name}: p50 / p90 / p99 ms"] = (
            f"{phase['p50_ms']:.1f} / {phase['p90_ms']:.1f} / {phase['p99_ms']:.1f}"
        )
    shown["other statuses"] = json.dumps(report["other_statuses"])
    shown["cores_used"] = json.dumps(report["cores_used"])
    _print_table(f"{report['concurrency']} closed-loop clients, mixed load", shown)
