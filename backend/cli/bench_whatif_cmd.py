"""`kvcentric bench whatif`: how long the console's What-if page takes on a recorded window
(the issue's acceptance: a 10-minute window in at most 30 s, with a progress bar)."""

import json
from dataclasses import asdict
from pathlib import Path

import typer

from backend.cli.bench_cmd import _print_table, bench_app
from backend.traces import SHIPPED_TRACE
from backend.traces.loader import TraceError, parse_minutes

# No Conductor runs here, so no live profile: the built-in profile of the tiny agents.
BENCH_TWIN_PROFILE = "tiny-cpu"


@bench_app.command("whatif")
def whatif(
    trace: Path = typer.Option(
        SHIPPED_TRACE, "--trace", dir_okay=False, help="Mooncake-format JSONL trace."
    ),
    minutes: str = typer.Option("0:10", "--minutes", help="The recorded window (A:B minutes)."),
    length_scale: float = typer.Option(
        1.0, "--length-scale", min=0.001, max=1.0, help="As the replay of `kvcentric up` sends."
    ),
    num_prefill: int = typer.Option(2, "--prefill", min=1, help="Live prefill agents."),
    num_decode: int = typer.Option(1, "--decode", min=1, help="Live decode agents."),
    profile: str = typer.Option(BENCH_TWIN_PROFILE, "--profile", help="The twin's timing profile."),
    change: str = typer.Option(
        '{"threshold": 1.0}',
        "--change",
        help="The proposed change, JSON: threshold, scheduler, rejection, decode_time_s, "
        "num_prefill.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
) -> None:
    """Parse the window and run the twin on current vs proposed, as the What-if page does."""
    from backend.bench.whatif import measure_whatif  # loads the twin

    try:
        window = parse_minutes(minutes)
        proposed = json.loads(change)
        if not isinstance(proposed, dict):
            raise ValueError("--change must be a JSON object")
        result = measure_whatif(
            trace,
            minutes=window,
            length_scale=length_scale,
            num_prefill=num_prefill,
            num_decode=num_decode,
            profile=profile,
            change=proposed,
        )
    except (TraceError, OSError, ValueError, TypeError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(asdict(result)))
        return
    shown = {k: v for k, v in asdict(result).items() if not isinstance(v, dict)}
    for role in ("baseline", "candidate"):
        for name, value in getattr(result, role).items():
            shown[f"{role} {name}"] = value
    shown["change"] = json.dumps(result.change)
    _print_table("what-if on a recorded window", shown)
