"""`kvcentric twin ...`: digital-twin runs, sweeps, what-if comparisons and the paper's experiments.

Numbers are read as text and checked here or by TwinConfig, so every bad input, whatever
the option, ends as one `error: ...` line on stderr with exit code 2.
"""

import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from backend.cli.children import EXIT_INTERRUPTED, stop_on_signals
from backend.policy.config import EVICTION_POLICIES, PREFILL_SCHEDULERS, REJECTION_POLICIES
from backend.traces import SHIPPED_TRACE
from backend.traces.loader import TraceRow, load_trace, parse_minutes
from twin.compare import compare, write_compare
from twin.config import TwinConfig
from twin.paper import DEFAULT_DOC, run_paper
from twin.report import write_report
from twin.run import simulate
from twin.sweep import expand_grid, results_table, run_sweep, swept_axes, write_sweep

twin_app = typer.Typer(
    help="The SimPy digital twin: replay a trace on a simulated cluster driven by the real "
    "policy core.",
    no_args_is_help=True,
)

_EXIT_BAD_INPUT = 2
_DEFAULT = TwinConfig()
_stderr = Console(stderr=True)

_TRACE_HELP = "Mooncake-format JSONL trace (default: the shipped one-hour conversation trace)."
_MINUTES_HELP = "Replay only rows arriving A to B minutes after the first one (A:B, A: or :B)."
_WORKERS_HELP = "Runs simulated at once, one process each (default: the number of CPUs)."
_CONFIG_HELP = (
    "TwinConfig settings as a JSON file or an inline JSON object, e.g. "
    '\'{"num_prefill": 8, "num_decode": 8, "threshold": "inf"}\'; unset fields keep the defaults.'
)
_THRESHOLD_HELP = (
    "kvcache_balancing_threshold in [1, inf]: a prefill instance fetches a remote cached "
    "prefix when it is at least this many times longer than its own (1: any longer prefix; "
    "inf: never fetch, pure local cache-aware). Used by the kvcache-centric scheduler only."
)
_SCHEDULER_HELP = f"Prefill scheduler: {', '.join(PREFILL_SCHEDULERS)}."
_REJECTION_HELP = (
    f"Overload policy: {', '.join(REJECTION_POLICIES)}. baseline checks decode load only "
    "when the request reaches decode (late rejection); early checks it before prefill; "
    "early-predicted checks the decode load predicted for when the prefill ends."
)
_SPEED_HELP = "Replay speed: 2 replays the trace's arrivals twice as fast."


@twin_app.command("run")
def run_command(
    trace: Path = typer.Option(SHIPPED_TRACE, "--trace", metavar="FILE", help=_TRACE_HELP),
    num_prefill: str = typer.Option(
        str(_DEFAULT.num_prefill), "--prefill", metavar="N", help="Prefill instances (>= 1)."
    ),
    num_decode: str = typer.Option(
        str(_DEFAULT.num_decode), "--decode", metavar="M", help="Decode instances (>= 1)."
    ),
    scheduler: str = typer.Option(
        _DEFAULT.scheduler, "--scheduler", metavar="S", help=_SCHEDULER_HELP
    ),
    rejection: str = typer.Option(
        _DEFAULT.rejection, "--rejection", metavar="R", help=_REJECTION_HELP
    ),
    threshold: str = typer.Option(
        f"{_DEFAULT.threshold:g}", "--threshold", metavar="X", help=_THRESHOLD_HELP
    ),
    speed: str = typer.Option(f"{_DEFAULT.speed:g}", "--speed", metavar="F", help=_SPEED_HELP),
    profile: str = typer.Option(
        _DEFAULT.profile,
        "--profile",
        metavar="P",
        help="Timing profile the twin executes work with: a built-in name or a profile JSON "
        "file (e.g. written by the agents' profiler).",
    ),
    minutes: str | None = typer.Option(None, "--minutes", metavar="A:B", help=_MINUTES_HELP),
    seed: str = typer.Option(
        str(_DEFAULT.seed), "--seed", metavar="N", help="Seed of the policy and the noise."
    ),
    noise: str = typer.Option(
        f"{_DEFAULT.noise:g}",
        "--noise",
        metavar="SD",
        help="Relative standard deviation of Gaussian noise on every executed duration, [0, 1).",
    ),
    decode_time: str = typer.Option(
        "learned",
        "--t-d",
        metavar="SECONDS",
        help="How long early-predicted expects each request to decode: learned (each "
        "request's max_tokens at the pace and share of recent completions) or a uniform "
        "t_d in seconds for every request (the paper's form, e.g. 20).",
    ),
    ttft_slo: str = typer.Option(
        "auto",
        "--ttft-slo",
        metavar="SECONDS",
        help="TTFT SLO; auto: 10x the TTFT of a lone request of the trace's mean length.",
    ),
    tbt_slo: str = typer.Option(
        "auto",
        "--tbt-slo",
        metavar="SECONDS",
        help="TBT SLO; auto: 5x the TBT of a lone request of the trace's mean length.",
    ),
    eviction: str = typer.Option(
        _DEFAULT.eviction,
        "--eviction",
        metavar="E",
        help=f"KV pool eviction policy: {', '.join(EVICTION_POLICIES)}.",
    ),
    reproducible: bool = typer.Option(
        False,
        "--reproducible",
        help="Write sim_wall_s as null, so two runs with one seed give byte-identical reports.",
    ),
    out: Path = typer.Option(
        Path("twin-report.json"), "--out", metavar="FILE", help="Where to write the report."
    ),
) -> None:
    """Simulate one cluster on a trace; write the JSON report and print its headline metrics."""
    with _bad_input():
        config = TwinConfig(
            num_prefill=_integer("--prefill", num_prefill),
            num_decode=_integer("--decode", num_decode),
            scheduler=scheduler,
            rejection=rejection,
            threshold=_number("--threshold", threshold),
            speed=_number("--speed", speed),
            profile=profile,
            seed=_integer("--seed", seed),
            noise=_number("--noise", noise),
            decode_time_s=_DEFAULT.decode_time_s
            if decode_time == "learned"
            else _number("--t-d", decode_time),
            learn_decode_time=decode_time == "learned",
            ttft_slo_s=None if ttft_slo == "auto" else _number("--ttft-slo", ttft_slo),
            tbt_slo_s=None if tbt_slo == "auto" else _number("--tbt-slo", tbt_slo),
            eviction=eviction,
        )
        rows = _load_rows(trace, minutes)
        with _progress(counts_runs=False) as progress:
            task = progress.add_task("simulating", total=1.0)
            report = simulate(
                config,
                rows,
                trace_label=_label(trace, minutes),
                on_progress=lambda done: progress.update(task, completed=done, refresh=True),
            )
        if reproducible:
            report["sim_wall_s"] = None
        write_report(report, out)
    _print_summary(report, f"twin run: {out}")


@twin_app.command("sweep")
def sweep_command(
    trace: Path = typer.Option(SHIPPED_TRACE, "--trace", metavar="FILE", help=_TRACE_HELP),
    minutes: str | None = typer.Option(None, "--minutes", metavar="A:B", help=_MINUTES_HELP),
    base: str | None = typer.Option(
        None, "--base", metavar="CONFIG", help="Settings every run starts from. " + _CONFIG_HELP
    ),
    thresholds: str = typer.Option(
        "", "--thresholds", metavar="LIST", help="Thresholds, e.g. 1,1.5,2,inf. " + _THRESHOLD_HELP
    ),
    splits: str = typer.Option(
        "",
        "--splits",
        metavar="LIST",
        help="Prefill:decode splits sharing one total, e.g. 4:12,8:8,12:4 (instances moved "
        "between the pools, the cluster size kept).",
    ),
    schedulers: str = typer.Option("", "--schedulers", metavar="LIST", help=_SCHEDULER_HELP),
    rejections: str = typer.Option("", "--rejections", metavar="LIST", help=_REJECTION_HELP),
    speeds: str = typer.Option("", "--speeds", metavar="LIST", help=_SPEED_HELP + " E.g. 1,2."),
    workers: str | None = typer.Option(None, "--workers", metavar="N", help=_WORKERS_HELP),
    ray: str | None = typer.Option(
        None,
        "--ray",
        metavar="ADDRESS",
        help="Run the sweep as Ray tasks (needs kvcentric[ray], and kvcentric on every "
        "worker): auto (this machine's cluster or RAY_ADDRESS), HOST:PORT of a head node, "
        "ray://HOST:10001, or local (a Ray instance started here with --workers CPUs). The "
        "reports are the same as without it.",
    ),
    out: Path = typer.Option(Path("twin-sweep"), "--out", metavar="DIR", help="Output folder."),
) -> None:
    """Simulate every combination of the given lists (an omitted list keeps the base value).

    Writes results.csv and results.json (one row per run: its settings and headline
    metrics) and sweep.html (each swept setting against the metrics it moves) into DIR.
    """
    with _bad_input():
        configs = expand_grid(
            TwinConfig.load(base) if base else _DEFAULT,
            thresholds=[_number("--thresholds", x) for x in _items(thresholds)],
            splits=[_split(x) for x in _items(splits)],
            schedulers=_items(schedulers),
            rejections=_items(rejections),
            speeds=[_number("--speeds", x) for x in _items(speeds)],
        )
        num_workers = _workers(workers)
        rows = _load_rows(trace, minutes)
        with _progress() as progress:
            task = progress.add_task(f"{len(configs)} runs", total=len(configs))
            try:
                reports = run_sweep(
                    configs,
                    rows,
                    workers=num_workers,
                    on_done=lambda *_: progress.update(task, advance=1, refresh=True),
                    trace_label=_label(trace, minutes),
                    ray_address=ray or None,
                )
            except RuntimeError as error:  # Ray missing, or its cluster not reachable
                _fail(str(error))
        paths = write_sweep(reports, out)
    table = results_table(reports)
    shown = [*swept_axes(table), "num_completed", "num_rejected", "ttft_mean_s", "ttft_p90_s"]
    _print_rows(table, [*shown, "slo_attainment", "goodput_rps"], f"twin sweep: {out}")
    for path in paths:
        typer.echo(f"wrote {path}", err=True)


@twin_app.command("compare")
def compare_command(
    baseline: str = typer.Option(..., "--baseline", metavar="CONFIG", help=_CONFIG_HELP),
    candidate: str = typer.Option(
        ..., "--candidate", metavar="CONFIG", help="The change to preview. " + _CONFIG_HELP
    ),
    trace: Path = typer.Option(SHIPPED_TRACE, "--trace", metavar="FILE", help=_TRACE_HELP),
    minutes: str | None = typer.Option(None, "--minutes", metavar="A:B", help=_MINUTES_HELP),
    workers: str = typer.Option("2", "--workers", metavar="N", help="1 runs both in turn."),
    out: Path = typer.Option(Path("twin-compare"), "--out", metavar="DIR", help="Output folder."),
) -> None:
    """Run a baseline and a candidate config on the same arrivals and print the metric deltas.

    Writes compare.json (changed settings, deltas), both reports and compare.html (TTFT
    CDFs, pool loads and rejections over time, side by side) into DIR.
    """
    with _bad_input():
        configs = [TwinConfig.load(baseline), TwinConfig.load(candidate)]
        num_workers = _integer("--workers", workers)
        rows = _load_rows(trace, minutes)
        with _progress() as progress:
            task = progress.add_task("baseline + candidate", total=2)
            result = compare(
                *configs,
                rows,
                workers=num_workers,
                trace_label=_label(trace, minutes),
                on_done=lambda *_: progress.update(task, advance=1, refresh=True),
            )
        write_compare(result, out)
    for name, values in result["changed_settings"].items():
        typer.echo(f"{name}: {values['baseline']} -> {values['candidate']}")
    columns = ["metric", "baseline", "candidate", "delta", "relative", "verdict"]
    _print_rows(result["deltas"], columns, f"twin compare: {out}")


@twin_app.command("paper")
def paper_command(
    trace: Path = typer.Option(
        SHIPPED_TRACE, "--trace", metavar="FILE", help="The conversation trace to replay whole."
    ),
    out: Path = typer.Option(
        Path("paper-results"), "--out", metavar="DIR", help="Folder for every table and plot."
    ),
    doc: Path = typer.Option(
        DEFAULT_DOC, "--doc", metavar="FILE", help="Markdown written with ours beside the paper's."
    ),
    workers: str | None = typer.Option(None, "--workers", metavar="N", help=_WORKERS_HELP),
) -> None:
    """The paper's experiments at paper scale (8P+8D on the whole trace), beside its numbers.

    (a) the four prefill schedulers vs Fig. 8, (b) the rejection policies at 2x vs Table 3
    with their load series, (c) cache hit ratio vs capacity vs Table 1, (d) P:D splits of 16
    instances, (e) replay speeds 1x-5x. Nothing is tuned towards the paper's numbers.
    """
    with _bad_input():
        num_workers = _workers(workers)
        with _progress() as progress:
            task = progress.add_task("paper experiments", total=None)
            run_paper(
                trace,
                out,
                doc_path=doc,
                workers=num_workers,
                on_progress=lambda done, total: progress.update(
                    task, completed=done, total=total, refresh=True
                ),
            )
    typer.echo(f"wrote {out}/ and {doc}")


VALIDATE_EPILOG = (
    "Example (the acceptance run of docs/fidelity.md):\n\n"
    "kvcentric twin validate --warmup-minutes 0:1 --minutes 1:3 --prefill 2 --decode 1 "
    '--changes \'[{}, {"kvcache_balancing_threshold": "inf"}, '
    '{"kvcache_balancing_threshold": 1}, {"prefill": 1, "decode": 2}]\' --out validate/'
)


@twin_app.command("validate", epilog=VALIDATE_EPILOG)
def validate_command(
    trace: Path = typer.Option(SHIPPED_TRACE, "--trace", metavar="FILE", help=_TRACE_HELP),
    warmup_minutes: str | None = typer.Option(
        None,
        "--warmup-minutes",
        metavar="A:B",
        help="Replayed first, to calibrate: the twin predicts with the calibration as of its "
        "end (default: none, the profile's model).",
    ),
    minutes: str = typer.Option(
        ..., "--minutes", metavar="C:D", help="The measured window, replayed after the warm-up."
    ),
    speed: str = typer.Option("1", "--speed", metavar="X", help=_SPEED_HELP),
    length_scale: str = typer.Option(
        "0.03125",
        "--length-scale",
        metavar="S",
        help="Shrinks prompts and outputs for a CPU; the default turns each 512-token trace "
        "block into one 16-token serving block, so the trace's prefix sharing is kept.",
    ),
    block_size: str = typer.Option(
        "16", "--block-size", metavar="N", help="Tokens per KV block, live and in the twin."
    ),
    num_prefill: str = typer.Option("2", "--prefill", metavar="N", help="Prefill agents."),
    num_decode: str = typer.Option("1", "--decode", metavar="M", help="Decode agents."),
    changes: str = typer.Option(
        "[{}]",
        "--changes",
        metavar="JSON-LIST",
        help="Configurations to compare, each a JSON object of PolicyConfig settings "
        "(kvcache_balancing_threshold, rejection_policy, ...) and prefill/decode for the "
        "split; {} is the base and is added first when missing.",
    ),
    slo_headroom: str = typer.Option(
        "10",
        "--slo-headroom",
        metavar="H",
        help="SLOs as kvcentric up sets them: 10x TTFT / 5x TBT of a lone request on the "
        "tiny-cpu profile, times this.",
    ),
    ttft_slo: str | None = typer.Option(
        None,
        "--ttft-slo",
        metavar="SECONDS",
        help="TTFT SLO of every config, instead of --slo-headroom's.",
    ),
    tbt_slo: str | None = typer.Option(
        None,
        "--tbt-slo",
        metavar="SECONDS",
        help="TBT SLO of every config, instead of --slo-headroom's (a tight one makes the "
        "decode pool the one that binds).",
    ),
    repeats: str = typer.Option(
        "1",
        "--repeats",
        metavar="N",
        help="Live runs of each config (each with its own warm-up and twin prediction): "
        "metrics compare the medians, and with N > 1 the JSON lists every run's figures and "
        "whether the twin lies within live's spread. The configs take turns (every config's "
        "first run, then every second one, ...), so the host's drift falls on all alike.",
    ),
    twin_seeds: str = typer.Option(
        "21",
        "--twin-seeds",
        metavar="N",
        help="Twin runs per prediction, one seed each for its drawn durations and delays; "
        "each metric's prediction is their median (under overload one seed's rejection "
        "count moves 17-41 %, the median of 21 about 5-11 %).",
    ),
    pool_warmups: bool = typer.Option(
        True,
        "--pool-warmups/--own-warmup",
        help="Predict each run from its own warm-up and those of every earlier run of its "
        "prefill:decode split, whatever its policy, as a Conductor keeping its calibration "
        "across the runs and policy changes would have measured them, less their windows, "
        "the earlier runs' times stretched to this run's host speed (each run keeps its own "
        "Conductor's beliefs and rest of the host): a short warm-up measures how the agents "
        "share the host from a few hundred steps. --own-warmup: each run from its own "
        "warm-up alone.",
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Folder for result.json, the raw reports and validate.html."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as one JSON object."),
) -> None:
    """Run a window live (its own stack per config) and in the twin, and compare metrics."""

    from backend.bench.validate import ValidateSettings, parse_changes, validate
    from backend.cli.up_cmd import demo_slos

    with _bad_input():
        parsed = parse_changes(changes)
        scale = _number("--length-scale", length_scale)
        if not 0 < scale <= 1:
            raise ValueError(f"--length-scale must be in (0, 1], got {length_scale}")
        parse_minutes(minutes)
        if warmup_minutes:
            parse_minutes(warmup_minutes)
        ttft_slo_s, tbt_slo_s = demo_slos(trace, scale, _number("--slo-headroom", slo_headroom))
        if ttft_slo is not None:
            ttft_slo_s = _positive("--ttft-slo", ttft_slo)
        if tbt_slo is not None:
            tbt_slo_s = _positive("--tbt-slo", tbt_slo)
        settings = ValidateSettings(
            trace=trace,
            warmup_minutes=warmup_minutes,
            minutes=minutes,
            speed=_number("--speed", speed),
            length_scale=scale,
            block_size=_integer("--block-size", block_size),
            num_prefill=_integer("--prefill", num_prefill),
            num_decode=_integer("--decode", num_decode),
            ttft_slo_s=ttft_slo_s,
            tbt_slo_s=tbt_slo_s,
            repeats=_integer("--repeats", repeats),
            twin_seeds=_integer("--twin-seeds", twin_seeds),
            pool_warmups=pool_warmups,
        )
    stop_on_signals()  # Ctrl-C or SIGTERM stop the stack it is running too
    try:
        result = _with_status(
            "validate",
            len(parsed) * settings.repeats,
            lambda on_status: validate(settings, parsed, out=out, on_status=on_status),
        )
    except KeyboardInterrupt:
        typer.echo("error: interrupted; the stack it was running is stopped", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    _show_validation(result, out, as_json)


def _with_status(
    name: str, total: int | None, work: Callable[[Callable[[str, float], None]], dict]
) -> dict:
    """`work(on_status)` under a progress bar on stderr, each status also printed when stderr
    is not a terminal (logs, tests); a ValueError or RuntimeError it raises is one `error:`
    line. `total`: runs to count, or None for a bar without a count."""
    with _progress(counts_runs=total is not None) as progress:
        task = progress.add_task(name, total=total)
        quiet = progress.disable

        def on_status(text: str, index: float) -> None:
            progress.update(task, completed=index, description=text[:80], refresh=True)
            if quiet:
                _stderr.print(text)

        try:
            result = work(on_status)
        except (ValueError, RuntimeError) as error:
            _fail(str(error))
        if total is not None:
            progress.update(task, completed=total, refresh=True)
    return result


def _show_validation(result: dict, out: Path | None, as_json: bool) -> None:
    """validate's and repredict's result: one JSON object, or a table and the tau."""
    import json

    if as_json:
        typer.echo(json.dumps(result))
        return
    rows = [
        {"config": json.dumps(c["change"]), "metric": name, **values}
        for c in result["configs"]
        for name, values in c["metrics"].items()
    ]
    _print_rows(rows, ["config", "metric", "live", "twin", "rel_err"], "live vs twin")
    typer.echo(f"kendall tau: {result['kendall_tau']}  directions: {result['directions']}")
    _print_host_speed(result["configs"])
    for name, verdict in result["bounds"].items():
        held = verdict["checked"] - len(verdict["missed"])
        typer.echo(f"{name} bounds: {held} of {verdict['checked']} held")
        for line in verdict["missed"]:
            typer.echo(f"  missed {line}")
        noise = verdict.get("live_noise")
        if noise is not None:
            parts = ", ".join(f"{k} {v:.2f}" for k, v in noise["chance_by_config"].items())
            typer.echo(
                f"  live's own spread: a twin predicting the median of live's runs exactly "
                f"would hold every config's items with chance {noise['chance_all_held']:.2f} "
                f"({parts})"
            )
    if out is not None:
        typer.echo(f"wrote {out}/result.json, {out}/validate.html and the raw reports")


def _print_host_speed(configs: list[dict[str, Any]]) -> None:
    """The host's speed over each config's warm-ups and windows (backend/bench/host_speed.py):
    a window slower than its warm-up is one the twin could not foresee."""
    import json

    parts = [
        f"{json.dumps(c['change'])} {speed['warmup']:.2f} -> {speed['window']:.2f}"
        f" ({speed['drift'] - 1:+.0%})"
        for c in configs
        if (speed := c.get("host_speed")) is not None
    ]
    if parts:
        typer.echo(
            "host speed, warm-up -> window (prefill CPU over the set's one model, medians "
            "of runs; above 1 slower): " + "; ".join(parts)
        )


@twin_app.command("repredict")
def repredict_command(
    kept: Path = typer.Argument(
        ..., metavar="KEPT", help="A folder `kvcentric twin validate --out` wrote."
    ),
    twin_seeds: str = typer.Option(
        "21", "--twin-seeds", metavar="N", help="Twin runs per prediction (as validate's)."
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Another folder for the new result.json, the reports and validate.html.",
    ),
    hindsight: bool = typer.Option(
        False,
        "--hindsight",
        help="Read each run's calibration as of the window's end, not the warm-up's: the "
        "twin's own error apart from the host's drift between warm-up and window (it has "
        "seen the window, so it is no prediction).",
    ),
    hindsight_of: str = typer.Option(
        "",
        "--hindsight-of",
        metavar="PARTS",
        help="Read only these parts of each run's live profile as of the window's end, the "
        "rest as of the warm-up's (comma-separated: prefill, decode, host, serving, link; "
        "e.g. decode): which of the warm-up's measurements a prediction's error comes from.",
    ),
    as_whatif: bool = typer.Option(
        False,
        "--whatif",
        help="Predict each run as the console's What-if predicts a recorded window: the "
        "live profile as of the window's end, and what live's Conductor believed over the "
        "warm-up and the window, each model from when it did: how far the What-if's run of "
        "the current configuration is from what live measured.",
    ),
    rebuild_profile: bool = typer.Option(
        False,
        "--rebuild-profile",
        help="Build each run's live profile again, with this code, from the measurements "
        "the run kept, instead of reading the profile live built: what a change to how "
        "profiles are built does (runs kept before the measurements were kept cannot).",
    ),
    pool_warmups: bool | None = typer.Option(
        None,
        "--pool-warmups/--own-warmup",
        show_default=False,
        help="Build each run's profile from its warm-up and those of the earlier kept runs "
        "of its split, as validate does by default (still a prediction: no window is read), "
        "or from its own warm-up alone. Default: as the kept validate did (sets kept before "
        "2026-12-07 pooled their configuration's runs alone).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as one JSON object."),
) -> None:
    """Predict the live runs a validate kept again, with this twin and no live run.

    What a change to the twin does to its fidelity, compared on the very windows live
    measured: seconds per config instead of a live run's minutes. The live figures are the
    kept ones; the twin reads each run's kept window and live profile, as validate did."""
    from backend.bench.validate import repredict

    with _bad_input():
        seeds = _integer("--twin-seeds", twin_seeds)
    result = _with_status(
        "repredict",
        None,
        lambda on_status: repredict(
            kept,
            seeds=seeds,
            hindsight=hindsight,
            hindsight_of=_items(hindsight_of),
            as_whatif=as_whatif,
            rebuild_profile=rebuild_profile,
            pool_warmups=pool_warmups,
            out=out,
            on_status=on_status,
        ),
    )
    _show_validation(result, out, as_json)


@contextmanager
def _bad_input() -> Iterator[None]:
    """Turn the errors bad input causes into one `error:` line (TraceError is a ValueError)."""
    try:
        yield
    except ValueError as error:
        _fail(str(error))
    except OSError as error:
        if error.filename is not None and error.strerror:
            _fail(f"{error.filename}: {error.strerror}")
        _fail(str(error))


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(_EXIT_BAD_INPUT)


def _integer(option: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{option} needs a whole number, got {text!r}") from None


def _number(option: str, text: str) -> float:
    try:
        return float(text)  # "inf" is a number here
    except ValueError:
        raise ValueError(f"{option} needs a number (or inf), got {text!r}") from None


def _positive(option: str, text: str) -> float:
    value = _number(option, text)
    if not 0 < value < float("inf"):
        raise ValueError(f"{option} must be a positive number of seconds, got {text!r}")
    return value


def _items(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _split(text: str) -> tuple[int, int]:
    prefill, colon, decode = text.partition(":")
    if not colon:
        raise ValueError(f"--splits: a split is P:D, e.g. 8:8, got {text!r}")
    return _integer("--splits", prefill), _integer("--splits", decode)


def _workers(text: str | None) -> int:
    if text is None:
        return os.cpu_count() or 1
    count = _integer("--workers", text)
    if count < 1:
        raise ValueError(f"--workers must be at least 1, got {count}")
    return count


def _load_rows(trace: Path, minutes: str | None) -> list[TraceRow]:
    return load_trace(trace, minutes=parse_minutes(minutes) if minutes is not None else None)


def _label(trace: Path, minutes: str | None) -> str:
    return f"{trace.name} minutes {minutes}" if minutes else trace.name


def _progress(*, counts_runs: bool = True) -> Progress:
    """A progress bar on stderr, off when stderr is not a terminal (logs, tests).

    It redraws when told (each finished run, each progress report of a single run), so
    no refresh thread runs beside the workers.
    """
    columns = [TextColumn("{task.description}"), BarColumn(), TaskProgressColumn()]
    if counts_runs:
        columns.append(MofNCompleteColumn())
    return Progress(
        *columns,
        TimeElapsedColumn(),
        console=_stderr,
        auto_refresh=False,
        disable=not _stderr.is_terminal,
    )


_SUMMARY = (
    "num_requests",
    "num_completed",
    "num_rejected",
    "num_rejected_admission",
    "num_rejected_decode",
    "num_failed",
    "ttft_mean_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "tbt_p50_s",
    "tbt_p90_s",
    "slo_attainment",
    "goodput_rps",
    "cache_hit_ratio",
    "reachable_hit_ratio",
    "wasted_prefill_s",
    "prefill_load_amplitude",
    "prefill_load_period_s",
    "decode_load_amplitude",
    "decode_load_period_s",
    "sim_duration_s",
    "sim_wall_s",
)


def _print_summary(report: dict, title: str) -> None:
    table = Table(title=title, show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    for name in _SUMMARY:
        table.add_row(name, _format(report.get(name)))
    for reason, count in report.get("rejected_by_reason", {}).items():
        table.add_row(f"rejected {reason}", _format(count))
    Console().print(table)


def _print_rows(rows: list[dict], columns: list[str], title: str) -> None:
    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="left" if column == "metric" else "right")
    for row in rows:
        table.add_row(*(_format(row.get(column)) for column in columns))
    Console(width=max(120, Console().width)).print(table)


def _format(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int) or (
        math.isfinite(value) and value == int(value) and abs(value) > 1e3
    ):
        return f"{value:,.0f}"
    return f"{value:,.4g}" if abs(value) < 1e3 else f"{value:,.1f}"
