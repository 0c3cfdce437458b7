"""The agents' benchmarks run from the command line and print one JSON object."""

import json

from typer.testing import CliRunner

from backend.cli import app


def run_json(*args: str) -> dict:
    result = CliRunner().invoke(app, ["bench", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_pool_benchmark(tmp_path) -> None:
    figures = run_json("pool", "--block-bytes", "4096", "--ssd-dir", str(tmp_path))
    assert figures and all(value >= 0 for value in figures.values() if isinstance(value, float))


def test_prefix_reuse_benchmark() -> None:
    figures = run_json("prefix-reuse", "--context", "512")
    assert figures["cold_s"] > 0 and figures["warm_s"] > 0
