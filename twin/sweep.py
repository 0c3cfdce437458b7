"""Parameter sweeps of the twin: the config grid, runs in parallel processes, the results table.

A sweep is the product of a few axes over one base TwinConfig. Each run is one `simulate`
call in a worker process; its report comes back whole and the table keeps one row per run:
the swept settings and the headline metrics, written as CSV and JSON beside the plots.
"""

import csv
import io
import itertools
import json
import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from pathlib import Path

import plotly.graph_objects as go

from backend.traces.loader import TraceRow
from twin.cluster import LiveCalibration
from twin.config import TwinConfig
from twin.plots import metric_vs_parameter_figure, write_page
from twin.run import simulate

SETTING_COLUMNS = ("split", "num_prefill", "num_decode", "scheduler", "rejection", "threshold")
SETTING_COLUMNS += ("speed", "seed")
HEADLINE_METRICS = (
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
    "tbt_p90_s",
    "slo_attainment",
    "goodput_rps",
    "cache_hit_ratio",
    "wasted_prefill_s",
    "prefill_load_amplitude",
    "prefill_load_period_s",
    "decode_load_amplitude",
    "decode_load_period_s",
    "decode_forecast_mae",
    "decode_forecast_bias",
    "sim_wall_s",
)
# The axes a sweep can vary, and the metrics plotted against each of them.
AXIS_METRICS: dict[str, tuple[str, ...]] = {
    "threshold": ("ttft_mean_s", "ttft_p90_s"),
    "split": ("goodput_rps",),
    "scheduler": ("ttft_mean_s", "ttft_p90_s"),
    "rejection": ("num_rejected",),
    "speed": ("num_rejected",),
}

OnDone = Callable[[int, dict], None]


def expand_grid(
    base: TwinConfig,
    thresholds: Sequence[float] = (),
    splits: Sequence[tuple[int, int]] = (),
    schedulers: Sequence[str] = (),
    rejections: Sequence[str] = (),
    speeds: Sequence[float] = (),
) -> list[TwinConfig]:
    """Every combination of the given axes over `base`; an empty axis keeps the base value.

    Splits are (prefill, decode) instance counts sharing one total, so that a sweep over them
    moves instances between the pools instead of also growing the cluster.
    """
    totals = {num_prefill + num_decode for num_prefill, num_decode in splits}
    if len(totals) > 1:
        shown = ", ".join(f"{p}:{d}" for p, d in splits)
        raise ValueError(f"splits must share one total of instances, got {shown}")
    axes = (
        splits or [(base.num_prefill, base.num_decode)],
        schedulers or [base.scheduler],
        rejections or [base.rejection],
        thresholds or [base.threshold],
        speeds or [base.speed],
    )
    return [
        base.with_changes(
            num_prefill=num_prefill,
            num_decode=num_decode,
            scheduler=scheduler,
            rejection=rejection,
            threshold=float(threshold),
            speed=float(speed),
        )
        for (num_prefill, num_decode), scheduler, rejection, threshold, speed in itertools.product(
            *axes
        )
    ]


def run_sweep(
    configs: Sequence[TwinConfig],
    rows: Sequence[TraceRow],
    *,
    workers: int,
    on_done: OnDone | None = None,
    trace_label: str = "",
    ray_address: str | None = None,
    live_calibrations: Sequence[LiveCalibration | None] | None = None,
) -> list[dict]:
    """Simulate every config on the same rows; the reports come back in `configs` order.
    `live_calibrations`: one per config (or None), the live Conductor's calibration that
    config's twin takes over (`simulate`'s `live_calibration`).

    With `workers` > 1 the runs go to that many processes. Each task carries the rows
    (pickling the whole shipped trace takes ~0.1 s, a run takes far longer), so workers keep
    no state. With `ray_address` they are Ray tasks instead (twin/ray_sweep.py), on that
    cluster or, for "local", on a Ray instance started here with `workers` CPUs.
    `on_done(index, report)` is called in the calling process as each run ends.
    The first failing run stops the sweep: queued runs are cancelled and its error re-raised.
    """
    if ray_address is not None:
        from twin.ray_sweep import run_on_ray  # Ray is optional: imported only when asked for

        return run_on_ray(
            configs,
            rows,
            address=ray_address,
            workers=workers,
            trace_label=trace_label,
            on_done=on_done,
            live_calibrations=live_calibrations,
        )
    rows = list(rows)
    calibrations = per_config(live_calibrations, configs)
    reports: dict[int, dict] = {}

    def finish(index: int, report: dict) -> None:
        reports[index] = report
        if on_done is not None:
            on_done(index, report)

    if workers <= 1 or len(configs) <= 1:
        for index, config in enumerate(configs):
            finish(index, simulate_one(config, rows, trace_label, calibrations[index]))
        return [reports[index] for index in range(len(configs))]
    # forkserver, not fork: callers such as the console's server run threads, and forking a
    # threaded process can copy a held lock into the child.
    context = multiprocessing.get_context("forkserver")
    pool = ProcessPoolExecutor(min(workers, len(configs)), mp_context=context)
    try:
        futures: dict[Future, int] = {
            pool.submit(simulate_one, config, rows, trace_label, calibrations[index]): index
            for index, config in enumerate(configs)
        }
        for future in as_completed(futures):
            finish(futures[future], future.result())
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return [reports[index] for index in range(len(configs))]


def results_table(reports: Sequence[dict]) -> list[dict]:
    """One row per report: its settings (SETTING_COLUMNS) and HEADLINE_METRICS."""
    table = []
    for report in reports:
        config = report["config"]
        row: dict = {name: config.get(name) for name in SETTING_COLUMNS if name != "split"}
        row["split"] = f"{config['num_prefill']}:{config['num_decode']}"
        row.update({name: report.get(name) for name in HEADLINE_METRICS})
        table.append({name: row[name] for name in (*SETTING_COLUMNS, *HEADLINE_METRICS)})
    return table


def swept_axes(table: Sequence[dict]) -> list[str]:
    """The axes of AXIS_METRICS that take more than one value in the table."""
    return [axis for axis in AXIS_METRICS if len({str(row[axis]) for row in table}) > 1]


def sweep_figures(table: Sequence[dict]) -> dict[str, go.Figure]:
    """A metric-vs-parameter chart per swept axis, one line per value of the other axes."""
    axes = swept_axes(table)
    return {
        axis: metric_vs_parameter_figure(
            table, axis, AXIS_METRICS[axis], group_by=[other for other in axes if other != axis]
        )
        for axis in axes
    }


def write_results(table: Sequence[dict], out_dir: Path, stem: str = "results") -> list[Path]:
    """Write the table as `stem`.csv and `stem`.json (an infinite threshold stays "inf")."""
    out_dir.mkdir(parents=True, exist_ok=True)
    columns = list(table[0]) if table else list((*SETTING_COLUMNS, *HEADLINE_METRICS))
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(table)
    csv_path = out_dir / f"{stem}.csv"
    csv_path.write_text(text.getvalue(), encoding="utf-8")
    json_path = out_dir / f"{stem}.json"
    json_path.write_text(json.dumps(list(table), indent=2) + "\n", encoding="utf-8")
    return [csv_path, json_path]


def write_sweep(reports: Sequence[dict], out_dir: Path, title: str = "twin sweep") -> list[Path]:
    """Write results.csv/.json and sweep.html (one chart per swept axis) into `out_dir`."""
    table = results_table(reports)
    paths = write_results(table, out_dir)
    figures = sweep_figures(table)
    if figures:
        paths.append(write_page(figures, out_dir / "sweep.html", title))
    return paths


def simulate_one(
    config: TwinConfig,
    rows: list[TraceRow],
    trace_label: str,
    live_calibration: LiveCalibration | None = None,
) -> dict:
    """One run of a sweep (a function of the module, so worker processes can import it)."""
    return simulate(config, rows, trace_label=trace_label, live_calibration=live_calibration)


def per_config(
    live_calibrations: Sequence[LiveCalibration | None] | None, configs: Sequence[TwinConfig]
) -> list[LiveCalibration | None]:
    """One live calibration (or None) per config."""
    if live_calibrations is None:
        return [None] * len(configs)
    if len(live_calibrations) != len(configs):
        raise ValueError(
            f"{len(live_calibrations)} live calibrations for {len(configs)} configs: one each"
        )
    return list(live_calibrations)
