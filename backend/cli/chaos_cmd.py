"""`kvcentric chaos`: a replay while agents and the Conductor are killed, restarted and
flooded on a schedule, then a check that nothing was lost (backend/bench/chaos.py)."""

import json
import shutil
import tempfile
from pathlib import Path

import typer

from backend.cli.children import EXIT_INTERRUPTED, stop_on_signals
from backend.traces import SHIPPED_TRACE

_EXIT_BAD_INPUT = 2


def chaos_command(
    trace: Path = typer.Option(
        SHIPPED_TRACE, "--trace", metavar="FILE", help="Mooncake-format JSONL trace to replay."
    ),
    minutes: str = typer.Option(
        "0:1.5", "--minutes", metavar="A:B", help="The window of the trace replayed."
    ),
    speed: float = typer.Option(1.0, "--speed", min=0.01, help="Replay speed (2: twice as fast)."),
    length_scale: float = typer.Option(
        1 / 32,
        "--length-scale",
        min=1e-6,
        max=1.0,
        help="Shrinks prompts and outputs for a CPU (kvcentric up's default).",
    ),
    num_prefill: int = typer.Option(2, "--prefill", min=1, help="Prefill agents (tiny)."),
    num_decode: int = typer.Option(2, "--decode", min=1, help="Decode agents (tiny)."),
    schedule: str = typer.Option(
        "",
        "--schedule",
        metavar="T:KIND:TARGET,...",
        help="Faults, seconds after the replay starts: kill (SIGKILL; the conductor or an "
        "agent), term (SIGTERM of an agent), flood (300 silent connections to an agent's "
        "data port for 5 s). Targets: conductor, prefill-0.., decode-0... Default: 10:kill:"
        "prefill-1, 25:flood:prefill-0, 35:kill:decode-0, 50:kill:conductor, 70:term:prefill-0.",
    ),
    settle_s: float = typer.Option(
        10.0, "--settle-s", min=0.0, help="Wait after the replay before reading the record."
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Keep the stack's database, logs and record.json here."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the record as one JSON object."),
) -> None:
    """Replay a trace on a stack of its own while its agents and Conductor are killed and
    started again (as kvcentric up does) and a data port is flooded; then check that every
    accepted request is in exactly one terminal state, none is open, no id came twice and no
    healthy agent was expelled. Prints a table (or JSON); exits 1 on any loss."""
    from backend.bench.chaos import (
        DEFAULT_SCHEDULE,
        ChaosSettings,
        parse_schedule,
        render_table,
        run_chaos,
    )
    from backend.cli.up_cmd import demo_slos
    from backend.traces.loader import parse_minutes

    try:
        parse_minutes(minutes)
        if not trace.is_file():
            raise ValueError(f"--trace: no file {trace}")
        ttft_slo_s, tbt_slo_s = demo_slos(trace, length_scale, 10.0)
        settings = ChaosSettings(
            trace=trace,
            minutes=minutes,
            speed=speed,
            length_scale=length_scale,
            num_prefill=num_prefill,
            num_decode=num_decode,
            schedule=parse_schedule(schedule or DEFAULT_SCHEDULE),
            ttft_slo_s=ttft_slo_s,
            tbt_slo_s=tbt_slo_s,
            settle_s=settle_s,
        )
        settings.check_targets()
    except ValueError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(_EXIT_BAD_INPUT) from None
    work_dir = Path(tempfile.mkdtemp(prefix="kvcentric-chaos-"))
    stop_on_signals()  # Ctrl-C or SIGTERM stop the stack it started too
    try:
        record = run_chaos(settings, work_dir, lambda m: typer.echo(f"chaos: {m}", err=True))
    except KeyboardInterrupt:
        typer.echo("error: interrupted; the stack it started is stopped", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    finally:
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            for name in ("data", "logs", "replay.jsonl", "replay.log"):
                source = work_dir / name
                if source.is_dir():
                    shutil.copytree(source, out / name, dirs_exist_ok=True)
                elif source.exists():
                    shutil.copy2(source, out / name)
        shutil.rmtree(work_dir, ignore_errors=True)
    if out is not None:
        (out / "record.json").write_text(json.dumps(record, indent=1) + "\n")
    typer.echo(json.dumps(record) if as_json else render_table(record))
    if not record["ok"]:
        raise typer.Exit(1)
