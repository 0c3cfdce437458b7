"""`kvcentric twin run|sweep|compare|paper`: one-line errors with exit 2, outputs, reproducible."""

import csv
import json

import pytest
from typer.testing import CliRunner

from backend.cli import app

runner = CliRunner()
WIDE = {"COLUMNS": "200"}
SHORT = ["--minutes", "0:1"]


def assert_one_line_error(result, problem: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.startswith("error: ")
    assert problem in result.stderr
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.output


@pytest.fixture
def broken_profile(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text('{"roofline": ')
    return str(path)


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (["--scheduler", "fastest"], "unknown scheduler 'fastest'; choose one of"),
        (["--rejection", "never"], "unknown rejection 'never'"),
        (["--eviction", "fifo"], "unknown eviction 'fifo'"),
        (["--prefill", "0"], "need at least one prefill and one decode instance, got 0P:8D"),
        (["--decode", "0"], "got 8P:0D"),
        (["--prefill", "two"], "--prefill needs a whole number, got 'two'"),
        (["--threshold", "0.5"], "threshold must be in [1, inf], got 0.5"),
        (["--threshold", "big"], "--threshold needs a number (or inf), got 'big'"),
        (["--speed", "0"], "speed must be a positive number"),
        (["--noise", "1.5"], "noise must be in [0, 1)"),
        (["--ttft-slo", "-1"], "ttft_slo_s must be a positive number"),
        (["--minutes", "5:3"], "needs A < B"),
        (["--trace", "/nonexistent/trace.jsonl"], "/nonexistent/trace.jsonl: No such file"),
        (["--profile", "no-such-profile"], "'no-such-profile' is neither a built-in"),
    ],
)
def test_run_rejects_bad_input_in_one_line(options, problem, tmp_path):
    result = runner.invoke(app, ["twin", "run", *options, "--out", str(tmp_path / "r.json")])

    assert_one_line_error(result, problem)
    assert not (tmp_path / "r.json").exists()


def test_run_rejects_an_unparsable_profile_file(broken_profile, tmp_path):
    options = ["--profile", broken_profile, *SHORT, "--out", str(tmp_path / "r.json")]

    result = runner.invoke(app, ["twin", "run", *options])

    assert_one_line_error(result, "is not valid JSON")


def test_run_accepts_an_infinite_threshold_and_reproduces_byte_for_byte(tmp_path):
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    options = ["--prefill", "2", "--decode", "2", "--threshold", "inf", "--seed", "5"]
    options += ["--noise", "0.1", *SHORT, "--reproducible"]

    results = [
        runner.invoke(app, ["twin", "run", *options, "--out", str(path)], env=WIDE)
        for path in paths
    ]

    assert [r.exit_code for r in results] == [0, 0], results[0].output
    assert paths[0].read_bytes() == paths[1].read_bytes()
    report = json.loads(paths[0].read_text())
    assert report["sim_wall_s"] is None
    assert report["config"]["threshold"] == "inf"
    assert (report["config"]["num_prefill"], report["config"]["noise"]) == (2, 0.1)
    assert "ttft_p90_s" in results[0].stdout and "goodput_rps" in results[0].stdout


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (["--splits", "4:12,4:4"], "splits must share one total of instances, got 4:12, 4:4"),
        (["--splits", "4-12"], "--splits: a split is P:D, e.g. 8:8, got '4-12'"),
        (["--splits", "0:16"], "need at least one prefill and one decode instance"),
        (["--schedulers", "random,fastest"], "unknown scheduler 'fastest'"),
        (["--thresholds", "1,0.5"], "threshold must be in [1, inf], got 0.5"),
        (["--speeds", "1,fast"], "--speeds needs a number"),
        (["--workers", "0"], "--workers must be at least 1, got 0"),
        (["--base", '{"num_decode": 0}'], "got 8P:0D"),
        (["--base", '{"prefil": 2}'], "unknown twin setting(s): prefil"),
        (["--base", "missing.json"], "is neither a JSON object nor a file"),
    ],
)
def test_sweep_rejects_bad_input_in_one_line(options, problem, tmp_path):
    result = runner.invoke(app, ["twin", "sweep", *options, "--out", str(tmp_path / "s")])

    assert_one_line_error(result, problem)
    assert not (tmp_path / "s").exists()


def test_sweep_writes_one_row_per_combination(tmp_path):
    out = tmp_path / "sweep"
    options = ["--base", '{"num_prefill": 2, "num_decode": 2}', "--thresholds", "1,inf"]
    options += ["--splits", "1:3,3:1", "--workers", "2", *SHORT, "--out", str(out)]

    result = runner.invoke(app, ["twin", "sweep", *options], env=WIDE)

    assert result.exit_code == 0, result.output
    with open(out / "results.csv", newline="") as lines:
        rows = list(csv.DictReader(lines))
    assert [(r["split"], r["threshold"]) for r in rows] == [
        ("1:3", "1.0"),
        ("1:3", "inf"),
        ("3:1", "1.0"),
        ("3:1", "inf"),
    ]
    assert (out / "sweep.html").is_file() and (out / "plotly.min.js").is_file()
    assert "3:1" in result.stdout


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (["--baseline", '{"num_prefill": 0}', "--candidate", "{}"], "got 0P:8D"),
        (["--baseline", "{}", "--candidate", '{"bogus": 1}'], "unknown twin setting(s): bogus"),
        (["--baseline", "{}", "--candidate", "{nope"], "is not valid JSON"),
        (["--baseline", "none.json", "--candidate", "{}"], "neither a JSON object nor a file"),
        (["--baseline", "{}", "--candidate", "{}", "--workers", "x"], "--workers needs"),
    ],
)
def test_compare_rejects_bad_input_in_one_line(options, problem, tmp_path):
    result = runner.invoke(app, ["twin", "compare", *options, "--out", str(tmp_path / "c")])

    assert_one_line_error(result, problem)


def test_compare_prints_the_changed_setting_and_the_deltas(tmp_path):
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"num_prefill": 2, "num_decode": 2, "speed": 3.0}))
    candidate = '{"num_prefill": 2, "num_decode": 2, "speed": 3.0, "rejection": "baseline"}'
    options = ["--baseline", str(baseline), "--candidate", candidate, *SHORT]

    result = runner.invoke(
        app, ["twin", "compare", *options, "--out", str(tmp_path / "c")], env=WIDE
    )

    assert result.exit_code == 0, result.output
    assert "rejection: early-predicted -> baseline" in result.stdout
    assert "ttft_p90_s" in result.stdout and "verdict" in result.stdout
    summary = json.loads((tmp_path / "c" / "compare.json").read_text())
    assert summary["changed_settings"] == {
        "rejection": {"baseline": "early-predicted", "candidate": "baseline"}
    }


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (["--trace", "/nonexistent/t.jsonl"], "/nonexistent/t.jsonl: No such file"),
        (["--workers", "many"], "--workers needs a whole number, got 'many'"),
    ],
)
def test_paper_rejects_bad_input_in_one_line(options, problem, tmp_path):
    command = ["twin", "paper", *options, "--out", str(tmp_path / "p")]

    result = runner.invoke(app, [*command, "--doc", str(tmp_path / "doc.md")])

    assert_one_line_error(result, problem)
    assert not (tmp_path / "doc.md").exists()


@pytest.mark.parametrize(
    ("command", "phrase"),
    [
        ("run", "fetches a remote cached prefix"),
        ("run", "byte-identical"),
        ("sweep", "sharing one total"),
        ("compare", "same arrivals"),
        ("paper", "Table 3"),
    ],
)
def test_help_explains_the_options(command, phrase):
    result = runner.invoke(app, ["twin", command, "--help"], env=WIDE)

    assert result.exit_code == 0
    assert phrase in " ".join(result.stdout.split())
