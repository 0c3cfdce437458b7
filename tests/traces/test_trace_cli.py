"""`kvcentric trace stats|cache-sim`: JSON and table output, one-line errors with exit code 2."""

import json

import pytest
from typer.testing import CliRunner

from backend.cli import app
from backend.traces.loader import iter_trace
from backend.traces.stats import trace_stats
from tests.traces.builders import full_blocks_row

runner = CliRunner()

SMALL_TRACE = [
    full_blocks_row(0, [1, 2]),
    full_blocks_row(1000, [1, 2]),
    full_blocks_row(2000, [3]),
    full_blocks_row(3000, [4]),
    full_blocks_row(4000, [1, 2]),
]


def test_stats_json_is_one_object_equal_to_trace_stats(write_trace):
    path = write_trace(SMALL_TRACE)

    result = runner.invoke(app, ["trace", "stats", str(path), "--json"])

    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == trace_stats(iter_trace(path))
    assert result.stdout.count("\n") == 1


def test_stats_table_names_each_figure(write_trace):
    path = write_trace(SMALL_TRACE)

    result = runner.invoke(app, ["trace", "stats", str(path)], env={"COLUMNS": "120"})

    assert result.exit_code == 0, result.output
    for figure in ("requests", "num_unique_blocks", "ideal_hit_ratio", "0.5000"):
        assert figure in result.stdout


def test_stats_minutes_keeps_a_window(write_trace):
    path = write_trace([full_blocks_row(ms, [i]) for i, ms in enumerate([0, 59_000, 60_000])])

    result = runner.invoke(app, ["trace", "stats", str(path), "--minutes", "0:1", "--json"])

    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["requests"] == 2


@pytest.mark.parametrize(("policy", "hits"), [("lru", 2), ("lfu", 4), ("length-aware", 3)])
def test_cache_sim_json_reports_the_policy_hit_ratio(write_trace, policy, hits):
    # The hand-computed replay of test_cache_sim.EVICTING_TRACE with 3 blocks.
    path = write_trace(SMALL_TRACE)

    result = runner.invoke(
        app,
        ["trace", "cache-sim", str(path), "--policy", policy, "--capacity-blocks", "3", "--json"],
    )

    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    assert (figures["policy"], figures["capacity_blocks"]) == (policy, 3)
    assert figures["hit_ratio"] == hits / 8


def test_cache_sim_without_capacity_is_unlimited(write_trace):
    path = write_trace(SMALL_TRACE)

    result = runner.invoke(app, ["trace", "cache-sim", str(path), "--policy", "lru"])

    assert result.exit_code == 0, result.output
    assert "unlimited" in result.stdout
    assert "0.5000" in result.stdout  # 4 hits of 8 blocks


@pytest.mark.parametrize(
    ("bad_line", "problem"),
    [
        ('{"timestamp": 5, "input_length": 512,', "broken JSON"),
        ('{"timestamp": 5, "input_length": 512, "hash_ids": [1]}', "missing field 'output_length'"),
        (
            '{"timestamp": 5, "input_length": -512, "output_length": 1, "hash_ids": [1]}',
            "'input_length' must not be negative, got -512",
        ),
        (
            '{"timestamp": 5, "input_length": 1500, "output_length": 1, "hash_ids": [1, 2]}',
            "'hash_ids' has 2 ids but input_length 1500 needs 3",
        ),
    ],
)
@pytest.mark.parametrize("command", [["stats"], ["cache-sim", "--policy", "lru"]])
def test_a_bad_line_is_one_error_line_naming_file_and_line(write_trace, bad_line, problem, command):
    path = write_trace([full_blocks_row(0, [1]), bad_line])

    result = runner.invoke(app, ["trace", command[0], str(path), *command[1:]])

    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"error: {path}:2: {problem}")
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.output


def test_a_missing_file_is_one_error_line(tmp_path):
    path = tmp_path / "absent.jsonl"

    result = runner.invoke(app, ["trace", "stats", str(path)])

    assert result.exit_code == 2
    assert result.stderr == f"error: {path}: No such file or directory\n"


def test_a_directory_is_one_error_line(tmp_path):
    result = runner.invoke(app, ["trace", "cache-sim", str(tmp_path), "--policy", "lfu"])

    assert result.exit_code == 2
    assert result.stderr == f"error: {tmp_path}: Is a directory\n"


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (["--policy", "fifo"], "'fifo' is not one of 'prefix-lru', 'lru', 'lfu', 'length-aware'"),
        (["--policy", "lru", "--capacity-blocks", "-1"], "--capacity-blocks"),
        (["--policy", "lru", "--minutes", "5:3"], "needs A < B"),
    ],
)
def test_bad_options_are_usage_errors(write_trace, options, problem):
    path = write_trace(SMALL_TRACE)

    result = runner.invoke(app, ["trace", "cache-sim", str(path), *options], env={"COLUMNS": "200"})

    assert result.exit_code == 2
    assert problem in result.stderr
    assert result.stdout == ""


def test_help_explains_the_hit_semantics():
    result = runner.invoke(app, ["trace", "cache-sim", "--help"], env={"COLUMNS": "200"})

    assert result.exit_code == 0
    assert "longest cached prefix" in result.stdout
    assert "omit for unlimited" in result.stdout
