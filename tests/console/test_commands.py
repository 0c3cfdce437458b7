"""`kvcentric console` (its streamlit command line and its checks) and `kvcentric bench
whatif` on a small window: the JSON carries the timing and both runs."""

import json

from typer.testing import CliRunner

from backend.cli import app as cli_app
from backend.cli.console_cmd import APP_PATH, streamlit_command
from console.settings import ConsoleSettings

runner = CliRunner()


def test_the_console_runs_headless_on_loopback_with_secrets_in_its_environment():
    settings = ConsoleSettings(backend_url="http://10.0.0.5:8000", api_key="key-123")
    args, env = streamlit_command(settings, host="127.0.0.1", port=8600)
    assert args[1:5] == ["-m", "streamlit", "run", str(APP_PATH)]
    options = dict(zip(args[5::2], args[6::2], strict=True))
    assert options["--server.address"] == "127.0.0.1"
    assert options["--server.port"] == "8600"
    assert options["--server.headless"] == "true"
    assert options["--browser.gatherUsageStats"] == "false"
    assert not any("key-123" in arg for arg in args)
    assert ConsoleSettings.from_env(env) == settings


def test_bad_options_are_one_line_errors():
    missing = runner.invoke(cli_app, ["console", "--twin-profile", "/nowhere/profile.json"])
    assert missing.exit_code == 2
    assert "error: --twin-profile: no file /nowhere/profile.json" in missing.output
    not_http = runner.invoke(cli_app, ["console", "--backend", "localhost:8000"])
    assert not_http.exit_code == 2
    assert "--backend must be an http(s) URL" in not_http.output


def test_bench_whatif_times_a_window_with_progress():
    result = runner.invoke(
        cli_app, ["bench", "whatif", "--minutes", "0:1", "--length-scale", "0.02", "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["num_requests"] > 100  # the shipped trace's first minute
    assert (report["num_prefill"], report["num_decode"]) == (2, 1)  # `kvcentric up`'s cluster
    assert report["change"] == {"threshold": 1.0}
    assert report["num_progress_updates"] >= 1
    assert report["total_s"] >= report["compare_s"] > 0
    assert report["is_within_limit"] == (report["total_s"] <= report["limit_s"] == 30.0)
    for role in ("baseline", "candidate"):
        run = report[role]
        assert run["num_completed"] + run["num_rejected"] == report["num_requests"]


def test_bench_whatif_rejects_a_bad_change():
    result = runner.invoke(cli_app, ["bench", "whatif", "--change", '{"speed": 2}'])
    assert result.exit_code == 2
    assert "speed" in result.output
