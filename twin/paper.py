"""The paper's experiments at paper scale: runs, tables, plots and docs/paper-results.md.

(a) the four prefill schedulers (paper Fig. 8), (b) the rejection policies at 2x replay
(Table 3) with their load series, (c) cache hit ratio vs pool capacity (Table 1), (d) the P:D
split at 16 instances and (e) replay speeds 1x-5x. Every twin run goes through one
run_sweep; nothing here is tuned towards the paper's numbers. The paper's figures come from
its own trace and A800 cluster, so the doc (twin/paper_doc.py) puts them beside ours with
a hand-written account of each difference.
"""

import json
import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from backend.traces.cache_sim import simulate_cache
from backend.traces.loader import TraceRow, load_trace
from twin.config import TwinConfig
from twin.paper_doc import load_account, render_doc
from twin.paper_settings import (
    CACHE_CAPACITIES,
    CACHE_POLICIES,
    DECODE_BOUND,
    DEFAULT_DOC,
    FORMAT,
    PAPER_HIT_RATIO,
    PLACEHOLDER,
    POLICY_SPLITS,
    REJECTIONS,
    SCHEDULERS,
    SPEEDS,
    SPLIT_SPEEDS,
    SPLITS,
)
from twin.plots import (
    load_figure,
    metric_vs_parameter_figure,
    rejections_figure,
    ttft_cdf_figure,
    write_page,
)
from twin.sweep import expand_grid, results_table, run_sweep, write_results

__all__ = ["PLACEHOLDER", "load_account", "paper_experiments", "render_doc", "run_paper"]


OnProgress = Callable[[int, int], None]
# The twin's defaults, but the paper's plain LRU in the pools (ours default to prefix-aware
# LRU, which evicts a prefix from its tail), so the reproduction runs what the paper ran.
PAPER_BASE = TwinConfig(eviction="lru")


def paper_experiments(base: TwinConfig | None = None) -> dict[str, list[TwinConfig]]:
    """The twin runs of (a) schedulers, (b)+(e) overload and (d) splits over `base` (8P+8D)."""
    base = base or PAPER_BASE
    # (a) measures TTFT alone: nothing is rejected, so every request has a TTFT.
    no_rejection = base.with_changes(rejection="none", speed=1.0)
    return {
        "schedulers": expand_grid(no_rejection, schedulers=SCHEDULERS),
        "overload": expand_grid(base, rejections=REJECTIONS, speeds=SPEEDS),
        "splits": expand_grid(base, splits=SPLITS, speeds=SPLIT_SPEEDS),
        "decode_bound": expand_grid(base.with_changes(**DECODE_BOUND), rejections=REJECTIONS),
        "policies": expand_grid(base, splits=POLICY_SPLITS, rejections=REJECTIONS, speeds=SPEEDS),
    }


def run_paper(
    trace: Path,
    out_dir: Path,
    *,
    doc_path: Path = DEFAULT_DOC,
    workers: int,
    on_progress: OnProgress | None = None,
) -> dict:
    """Run every experiment on the whole trace, write tables/pages into out_dir and the doc."""
    rows = load_trace(trace)
    experiments = paper_experiments()
    unique = list(dict.fromkeys(c for configs in experiments.values() for c in configs))
    cells = [(p, c) for p in CACHE_POLICIES for c in CACHE_CAPACITIES]
    total = len(unique) + len(cells)
    done = [0]

    def tick(*_: object) -> None:
        done[0] += 1
        if on_progress is not None:
            on_progress(done[0], total)

    reports = run_sweep(unique, rows, workers=workers, on_done=tick, trace_label=trace.name)
    by_config = dict(zip(unique, reports, strict=True))
    runs = {name: [by_config[c] for c in configs] for name, configs in experiments.items()}
    summary = {
        "format": FORMAT,
        "trace": {**reports[0]["trace"], "file": trace.name},
        "base_config": PAPER_BASE.to_dict(),
        **{name: results_table(name_reports) for name, name_reports in runs.items()},
        "cache": cache_hit_ratios(rows, cells, workers=workers, on_done=tick),
    }
    write_outputs(summary, runs, out_dir)
    doc_path.parent.mkdir(parents=True, exist_ok=True)
    account = load_account(doc_path.with_name("paper-account.md"))
    doc_path.write_text(render_doc(summary, out_dir, doc_path, account), encoding="utf-8")
    return summary


def cache_hit_ratios(
    rows: Sequence[TraceRow],
    cells: Sequence[tuple[str, int | None]],
    *,
    workers: int,
    on_done: Callable[[], None] | None = None,
) -> list[dict]:
    """simulate_cache for each (policy, capacity) cell, in parallel; results in cell order."""
    rows = list(rows)
    context = multiprocessing.get_context("forkserver")  # as run_sweep: safe beside threads
    with ProcessPoolExecutor(max(1, min(workers, len(cells))), mp_context=context) as pool:
        futures = [pool.submit(simulate_cache, rows, policy, cap) for policy, cap in cells]
        results = []
        for future in futures:
            results.append(future.result())
            if on_done is not None:
                on_done()
    return results


def write_outputs(summary: dict, runs: dict[str, list[dict]], out_dir: Path) -> list[Path]:
    """Tables as CSV/JSON, paper.json, reports.json (no per-request rows) and the HTML pages."""
    paths = []
    for name in ("schedulers", "overload", "splits", "cache", "decode_bound", "policies"):
        paths += write_results(summary[name], out_dir, stem=name)
    paths.append(out_dir / "paper.json")
    paths[-1].write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", "utf-8")
    light = {name: [_without_requests(r) for r in reports] for name, reports in runs.items()}
    paths.append(out_dir / "reports.json")
    paths[-1].write_text(json.dumps(light, sort_keys=True) + "\n", "utf-8")
    for stem, (title, figures) in _pages(summary, runs).items():
        paths.append(write_page(figures, out_dir / f"{stem}.html", title))
    return paths


def _pages(summary: dict, runs: dict[str, list[dict]]) -> dict:
    schedulers = {r["config"]["scheduler"]: r for r in runs["schedulers"]}
    at_2x = {r["config"]["rejection"]: r for r in runs["overload"] if r["config"]["speed"] == 2.0}
    bound = {r["config"]["rejection"]: r for r in runs["decode_bound"]}
    paper_cache = [
        {"policy": f"{p} (paper)", "capacity_blocks": c, "hit_ratio": ratio}
        for p, ratios in PAPER_HIT_RATIO.items()
        for c, ratio in sorted(ratios.items(), key=lambda item: item[0] or 10**12)
    ]
    ttft = ("ttft_mean_s", "ttft_p90_s")
    return {
        "schedulers": (
            "(a) prefill schedulers, 8P+8D, 1x",
            {
                "ttft_cdf": ttft_cdf_figure(schedulers),
                "ttft": metric_vs_parameter_figure(summary["schedulers"], "scheduler", ttft),
            },
        ),
        "overload": (
            "(b) rejection policies at 2x, (e) replay speed 1x-5x",
            {
                **{
                    f"load-{p}": load_figure({p: r}, title=f"Pool load, {p}, 2x")
                    for p, r in at_2x.items()
                },
                "rejections": rejections_figure(at_2x),
                "rejected_vs_speed": metric_vs_parameter_figure(
                    summary["overload"], "speed", ["num_rejected"], group_by=["rejection"]
                ),
                "goodput_vs_speed": metric_vs_parameter_figure(
                    summary["overload"], "speed", ["goodput_rps"], group_by=["rejection"]
                ),
            },
        ),
        "decode_bound": (
            "(b') rejection policies where decode binds: 14P+2D at 4x",
            {
                **{
                    f"load-{p}": load_figure({p: r}, title=f"Pool load, {p}, 14P+2D, 4x")
                    for p, r in bound.items()
                },
                "rejections": rejections_figure(bound),
            },
        ),
        "splits": (
            "(d) P:D split at 16 instances",
            {
                metric: metric_vs_parameter_figure(
                    summary["splits"], "split", [metric], group_by=["speed"]
                )
                for metric in ("goodput_rps", "ttft_p90_s", "num_rejected")
            },
        ),
        "policies": (
            "(f) the three policies across speeds 1x-5x and P:D splits of 8 instances",
            _policy_figures(summary["policies"], runs["policies"]),
        ),
        "cache": (
            "(c) cache hit ratio vs capacity",
            {
                "hit_ratio": metric_vs_parameter_figure(
                    [*summary["cache"], *paper_cache],
                    "capacity_blocks",
                    ["hit_ratio"],
                    group_by=["policy"],
                )
            },
        ),
    }


POLICY_METRICS = (
    "goodput_rps",
    "wasted_prefill_s",
    "num_rejected_admission",
    "num_rejected_decode",
    "slo_attainment",
    "decode_load_amplitude",
)


def _policy_figures(table: list[dict], reports: list[dict]) -> dict:
    """Per split, each metric against speed with a line per policy; and the pool loads of
    the three policies at the split that binds decode hardest, at 4x."""
    figures = {}
    for split in dict.fromkeys(row["split"] for row in table):
        rows = [row for row in table if row["split"] == split]
        for metric in POLICY_METRICS:
            figures[f"{metric}-{split}"] = metric_vs_parameter_figure(
                rows, "speed", [metric], group_by=["rejection"], title=f"{metric}, {split}"
            )
    p, d = POLICY_SPLITS[0]
    for report in reports:
        config = report["config"]
        if (config["num_prefill"], config["num_decode"], config["speed"]) == (p, d, 4.0):
            name = config["rejection"]
            figures[f"load-{name}"] = load_figure(
                {name: report}, title=f"Pool load, {name}, {p}P:{d}D, 4x"
            )
    return figures


def _without_requests(report: dict) -> dict:
    return {key: value for key, value in report.items() if key != "requests"}
