"""twin.sweep: the config grid, the results table and its files, parallel runs equal serial ones."""

import csv
import json
import math

import pytest

from backend.traces.loader import load_trace
from tests.twin.report_helpers import fake_report, parse_page
from twin.config import TwinConfig
from twin.report import dumps_report
from twin.sweep import (
    HEADLINE_METRICS,
    SETTING_COLUMNS,
    expand_grid,
    results_table,
    run_sweep,
    swept_axes,
    write_sweep,
)

BASE = TwinConfig(num_prefill=2, num_decode=2, rejection="early", speed=1.5, seed=3)
REJECTIONS = ("baseline", "early", "early-predicted")


def test_grid_is_the_product_of_the_given_axes():
    configs = expand_grid(
        BASE,
        thresholds=[1.0, math.inf],
        splits=[(1, 3), (3, 1)],
        schedulers=["random", "kvcache-centric"],
        speeds=[1.0, 2.0],
    )

    cells = {(c.threshold, c.num_prefill, c.num_decode, c.scheduler, c.speed) for c in configs}
    assert len(configs) == len(cells) == 2 * 2 * 2 * 2
    assert {c.rejection for c in configs} == {"early"}  # an empty axis keeps the base value
    assert {c.seed for c in configs} == {3}
    assert (math.inf, 3, 1, "random", 2.0) in cells


def test_no_axes_is_the_base_config_once():
    assert expand_grid(BASE) == [BASE]


def test_one_axis_changes_only_that_setting():
    configs = expand_grid(BASE, rejections=["baseline", "early", "early-predicted"])

    assert configs == [BASE.with_changes(rejection=r) for r in REJECTIONS]


def test_splits_must_share_one_total():
    with pytest.raises(ValueError, match="share one total"):
        expand_grid(BASE, splits=[(4, 12), (4, 4)])


def test_a_bad_value_on_an_axis_is_the_config_error():
    with pytest.raises(ValueError, match="unknown scheduler 'fastest'"):
        expand_grid(BASE, schedulers=["random", "fastest"])
    with pytest.raises(ValueError, match="threshold must be in"):
        expand_grid(BASE, thresholds=[0.5])


def sweep_reports() -> list[dict]:
    configs = expand_grid(BASE, thresholds=[1.0, math.inf], speeds=[1.0, 2.0])
    return [
        fake_report(config, ttft_mean_s=float(index), num_rejected=10 * index)
        for index, config in enumerate(configs)
    ]


def test_table_row_holds_the_settings_and_the_headline_metrics():
    table = results_table(sweep_reports())

    assert list(table[0]) == [*SETTING_COLUMNS, *HEADLINE_METRICS]
    assert table[3]["split"] == "2:2"
    assert (table[3]["threshold"], table[3]["speed"]) == ("inf", 2.0)
    assert (table[3]["ttft_mean_s"], table[3]["num_rejected"]) == (3.0, 30)
    assert swept_axes(table) == ["threshold", "speed"]


def test_sweep_files_parse_back_to_the_table(tmp_path):
    reports = sweep_reports()

    paths = write_sweep(reports, tmp_path)

    assert [p.name for p in paths] == ["results.csv", "results.json", "sweep.html"]
    table = results_table(reports)
    assert json.loads((tmp_path / "results.json").read_text()) == table
    with open(tmp_path / "results.csv", newline="") as lines:
        rows = list(csv.DictReader(lines))
    assert len(rows) == 4
    assert rows[3]["threshold"] == "inf"
    assert float(rows[2]["ttft_mean_s"]) == 2.0
    page = parse_page(tmp_path / "sweep.html")
    assert page.div_ids == ["figure-threshold", "figure-speed"]  # one chart per swept axis
    assert (tmp_path / "plotly.min.js").is_file()


@pytest.fixture(scope="module")
def two_minutes(shipped_trace):
    """The first two minutes of the shipped trace (a few hundred requests)."""
    return load_trace(shipped_trace, minutes=(0.0, 2.0))


def test_parallel_sweep_equals_the_serial_one_in_config_order(two_minutes):
    configs = expand_grid(BASE, thresholds=[1.0, math.inf], speeds=[1.0, 4.0])
    done: list[int] = []

    parallel = run_sweep(
        configs, two_minutes, workers=2, on_done=lambda i, r: done.append(i), trace_label="2min"
    )
    serial = run_sweep(configs, two_minutes, workers=1, trace_label="2min")

    assert sorted(done) == [0, 1, 2, 3]
    unset_slos = {"ttft_slo_s": None, "tbt_slo_s": None}  # reports show the derived ones
    assert [{**r["config"], **unset_slos} for r in parallel] == [c.to_dict() for c in configs]
    assert [r["trace"]["label"] for r in parallel] == ["2min"] * 4
    assert all(r["num_requests"] == len(two_minutes) for r in parallel)
    assert [_comparable(r) for r in parallel] == [_comparable(r) for r in serial]
    slow, fast = parallel[0], parallel[1]
    assert fast["num_rejected"] > slow["num_rejected"]  # 4x on 2P+2D overloads it


def test_a_failing_run_stops_the_sweep_with_its_error(two_minutes, tmp_path):
    broken = tmp_path / "profile.json"
    broken.write_text("{")
    configs = [BASE, BASE.with_changes(profile=str(broken))]

    with pytest.raises(ValueError, match="not valid JSON"):
        run_sweep(configs, two_minutes, workers=2)


def test_live_calibrations_come_one_per_config(two_minutes):
    with pytest.raises(ValueError, match="1 live calibrations for 2 configs: one each"):
        run_sweep([BASE, BASE], two_minutes, workers=1, live_calibrations=[None])


def _comparable(report: dict) -> str:
    return dumps_report({**report, "sim_wall_s": None})
