"""`kvcentric trace ...`: statistics and cache simulation of Mooncake-format traces."""

import json
from enum import StrEnum
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.table import Table

from backend.traces.cache_sim import simulate_cache
from backend.traces.loader import TRACE_BLOCK_SIZE, TraceError, TraceRow, load_trace, parse_minutes
from backend.traces.stats import trace_stats

trace_app = typer.Typer(help="Inspect Mooncake-format JSONL traces.", no_args_is_help=True)

_EXIT_BAD_INPUT = 2


class EvictionPolicy(StrEnum):
    prefix_lru = "prefix-lru"
    lru = "lru"
    lfu = "lfu"
    length_aware = "length-aware"


_TRACE_HELP = "JSONL trace: one {timestamp, input_length, output_length, hash_ids} per line."
_BLOCK_SIZE_HELP = "Tokens per hash id in the trace (Mooncake traces: 512)."
_MINUTES_HELP = "Only rows arriving A to B minutes after the first one (A:B, A: or :B)."
_JSON_HELP = "Print one JSON object on stdout instead of a table."


@trace_app.command("stats")
def stats_command(
    trace: Path = typer.Argument(..., metavar="FILE", help=_TRACE_HELP),
    block_size: int = typer.Option(TRACE_BLOCK_SIZE, "--block-size", min=1, help=_BLOCK_SIZE_HELP),
    minutes: str | None = typer.Option(None, "--minutes", help=_MINUTES_HELP),
    as_json: bool = typer.Option(False, "--json", help=_JSON_HELP),
) -> None:
    """Volume, lengths, arrival rate and the best possible prefix reuse of a trace.

    ideal_hit_ratio = 1 - unique blocks / all blocks: the share of blocks an infinite
    cache would serve from a longest-prefix match (an id names its block and its prefix).
    """
    figures = trace_stats(_load(trace, block_size, minutes))
    _report(figures, "trace stats", trace, as_json)


@trace_app.command("cache-sim")
def cache_sim_command(
    trace: Path = typer.Argument(..., metavar="FILE", help=_TRACE_HELP),
    policy: EvictionPolicy = typer.Option(..., "--policy", help="Eviction order of the cache."),
    capacity_blocks: int | None = typer.Option(
        None, "--capacity-blocks", min=0, help="Blocks the cache holds; omit for unlimited."
    ),
    block_size: int = typer.Option(TRACE_BLOCK_SIZE, "--block-size", min=1, help=_BLOCK_SIZE_HELP),
    minutes: str | None = typer.Option(None, "--minutes", help=_MINUTES_HELP),
    as_json: bool = typer.Option(False, "--json", help=_JSON_HELP),
) -> None:
    """Prefix hit ratio of one block cache replaying the trace under an eviction policy.

    Requests are replayed in file order through one cache keyed by hash id. A request's
    hits are the blocks of its longest cached prefix, counted before it inserts all its
    blocks (its own blocks are pinned meanwhile, so it never evicts them; a block that
    finds only pinned blocks to evict is not cached). hit_ratio = hits / all blocks.
    """
    rows = _load(trace, block_size, minutes)
    figures = simulate_cache(rows, policy.value, capacity_blocks)
    _report(figures, "cache-sim", trace, as_json)


def _load(trace: Path, block_size: int, minutes: str | None) -> list[TraceRow]:
    """The trace's rows; a bad file or window is one line on stderr and exit code 2."""
    try:
        window = parse_minutes(minutes) if minutes is not None else None
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--minutes") from None
    try:
        return load_trace(trace, block_size, window)
    except TraceError as error:
        _fail(str(error))
    except OSError as error:
        _fail(f"{trace}: {error.strerror or error}")


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(_EXIT_BAD_INPUT)


def _report(figures: dict, title: str, trace: Path, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(figures))
        return
    table = Table(title=title, caption=str(trace))
    table.add_column("figure")
    table.add_column("value", justify="right")
    for name, value in figures.items():
        table.add_row(name, _format(name, value))
    Console().print(table)


def _format(name: str, value: object) -> str:
    if name == "capacity_blocks" and value is None:
        return "unlimited"
    if isinstance(value, float):
        return f"{value:.4f}" if name.endswith("_ratio") else f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
