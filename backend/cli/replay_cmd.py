"""`kvcentric replay`: replay a trace against a running REST API and record every request."""

import asyncio
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from backend.cli.quiet_gc import quiet_garbage_collection
from backend.cli.secrets_file import DEFAULT_PATH as DEFAULT_SECRETS_PATH
from backend.cli.secrets_file import read_secrets
from backend.loadgen.plan import ReplayConfig, plan_requests
from backend.loadgen.replay import PreflightError, check_server, replay
from backend.loadgen.results import ReplaySummary, RequestResult, summarize
from backend.traces import SHIPPED_TRACE
from backend.traces.loader import TraceError, load_trace, parse_minutes

_EXIT_BAD_INPUT = 2
DEFAULT_URL = "http://127.0.0.1:8000"


def replay_command(
    url: str | None = typer.Option(
        None,
        "--url",
        help="Base URL of the REST API, e.g. http://host:8000. Default: the --secrets-file's, "
        f"else {DEFAULT_URL}.",
    ),
    trace: Path = typer.Option(
        SHIPPED_TRACE,
        "--trace",
        metavar="FILE",
        help="Mooncake-format JSONL trace. Default: the shipped conversation trace.",
    ),
    api_key: str | None = typer.Option(
        None, "--api-key", envvar="KVC_API_KEY", help="API key. Default: the --secrets-file's."
    ),
    secrets_file: Path = typer.Option(
        DEFAULT_SECRETS_PATH,
        "--secrets-file",
        help="Where `kvcentric up` saved the URL and keys (read when present).",
    ),
    out: Path = typer.Option(
        Path("replay-results.jsonl"), "--out", help="Results file: one JSON line per request."
    ),
    speed: float = typer.Option(
        1.0, "--speed", min=0.0, help="Arrival-time speed-up (2: twice as fast)."
    ),
    length_scale: float = typer.Option(
        1.0, "--length-scale", min=0.0, max=1.0, help="Shrinks prompts and outputs, in (0, 1]."
    ),
    minutes: str | None = typer.Option(
        None, "--minutes", help="Only rows arriving A to B minutes after the first (A:B)."
    ),
    max_tokens_cap: int | None = typer.Option(
        None, "--max-tokens-cap", min=1, help="Most output tokens asked per request."
    ),
    concurrency_limit: int | None = typer.Option(
        None, "--concurrency-limit", min=1, help="Most requests in flight; later ones wait."
    ),
    wait_s: float = typer.Option(
        60.0,
        "--wait-s",
        min=0.0,
        help="Wait up to this long for the Conductor to answer and a prefill and a decode "
        "agent to join (a stack still starting) before the first request.",
    ),
) -> None:
    """Send each trace row to POST /v1/native/requests at its (scaled) arrival time.

    Prompts go as hash ids so prefixes are shared exactly as in the trace; outputs are the
    trace's output lengths times --length-scale. TTFT and token gaps are measured here.
    """
    err = Console(stderr=True)
    try:
        saved = read_secrets(secrets_file)
    except (OSError, ValueError) as error:
        _fail(f"--secrets-file: {error}")
    url = url or saved.get("KVC_URL") or DEFAULT_URL
    api_key = api_key or saved.get("KVC_API_KEY")
    if not api_key:
        _fail(
            f"no API key: pass --api-key, set KVC_API_KEY, or point --secrets-file at the "
            f"file `kvcentric up` wrote (no {secrets_file})"
        )
    try:
        config = ReplayConfig(speed=speed, length_scale=length_scale, max_tokens_cap=max_tokens_cap)
        window = parse_minutes(minutes) if minutes is not None else None
        rows = load_trace(trace, minutes=window)
    except (TraceError, ValueError) as error:
        _fail(str(error))
    except OSError as error:
        _fail(f"{trace}: cannot read the trace: {error.strerror or error}")
    base_url = url.rstrip("/")
    try:
        check_server(
            base_url, api_key, wait_s=wait_s, on_wait=lambda text: typer.echo(text, err=True)
        )
    except PreflightError as error:
        _fail(str(error))
    planned = plan_requests(rows, config)
    quiet_garbage_collection()  # the plan lives as long as the replay; results pile up
    progress = Progress(
        TextColumn("replay"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[line]}"),
        TimeElapsedColumn(),
        console=err,
    )
    task = progress.add_task("replay", total=len(planned), line="")

    def on_result(result: RequestResult) -> None:
        progress.update(task, advance=1, line=f"last: line {result.line} {result.status}")

    try:
        with out.open("w") as results_file, progress:
            run = asyncio.run(
                replay(
                    base_url,
                    api_key,
                    planned,
                    results_file,
                    concurrency_limit=concurrency_limit,
                    on_result=on_result,
                )
            )
    except OSError as error:
        _fail(f"{out}: cannot write the results: {error.strerror or error}")
    _print_summary(summarize(run.results, run.duration_s), out)


def _print_summary(summary: ReplaySummary, out: Path) -> None:
    console = Console()
    counts = ", ".join(f"{status} {count}" for status, count in summary.counts.items())
    console.print(
        f"{summary.num_requests} requests in {summary.duration_s:.2f} s: {counts or 'none'}"
    )
    for name, figures in (("TTFT", summary.ttft_s), ("TBT", summary.tbt_s)):
        shown = "  ".join(f"{key} {value * 1000:.1f} ms" for key, value in figures.items())
        console.print(f"{name}: {shown or 'n/a'}")
    console.print(
        f"achieved: {summary.sent_per_s:.2f} req/s sent, "
        f"{summary.completed_per_s:.2f} req/s completed"
    )
    console.print(f"results: {out}")


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(_EXIT_BAD_INPUT)
