"""`kvcentric bench admission` for two seconds: its own stack starts, every request is
rejected early, the JSON has its figures. Speed is measured in docs/benchmarks.md, never
asserted here."""

import json
import shutil

import pytest
from typer.testing import CliRunner

from backend.bench.admission import request_bodies
from backend.cli import app

runner = CliRunner()

KEYS = {
    "rps", "p50_ms", "p90_ms", "p99_ms", "max_ms", "num_requests", "num_rejected_early",
    "other_statuses", "all_rejected_early", "rps_vs_health", "health", "machine", "overload",
    "ttft_slo_s", "idle_prefill_s", "num_recorded_requests", "num_recorded_rejected_early",
    "num_warmup_requests", "server_cpu_ms_per_request", "client_cpu_ms_per_request",
    "endpoint", "concurrency", "prompt_tokens",
}  # fmt: skip


def test_every_request_is_rejected_early_and_recorded() -> None:
    args = ["bench", "admission", "--duration-s", "2", "--concurrency", "2", "--warmup-s", "0.3"]
    result = runner.invoke(app, [*args, "--prompt-tokens", "600", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)  # stdout holds only the JSON object

    assert set(report) >= KEYS
    assert report["num_requests"] > 0
    assert report["num_rejected_early"] == report["num_requests"]
    assert report["other_statuses"] == {}
    assert report["all_rejected_early"] is True
    # The stopped Conductor's database holds each request sent, warm-up included, as
    # rejected at admission: nothing was dispatched, nothing lost.
    sent = report["num_requests"] + report["num_warmup_requests"]
    assert report["num_recorded_requests"] == sent
    assert report["num_recorded_rejected_early"] == sent

    assert 0 < report["p50_ms"] <= report["p90_ms"] <= report["p99_ms"] <= report["max_ms"]
    assert report["rps"] > 0 and report["rps_vs_health"] > 0
    health = report["health"]
    assert health["path"] == "/healthz" and health["statuses"] == {"200": health["num_requests"]}
    assert report["endpoint"] == "/v1/completions" and report["concurrency"] == 2
    assert 0 < report["prompt_tokens"] <= 600
    # The overload is a TTFT SLO below the idle prefill time, set through the config API.
    assert report["ttft_slo_s"] < report["idle_prefill_s"]
    assert "PUT /v1/config" in report["overload"]
    assert report["machine"]["nproc"] >= 1


def test_an_unknown_endpoint_is_refused_before_anything_starts() -> None:
    result = runner.invoke(app, ["bench", "admission", "--endpoint", "grpc", "--json"])
    assert result.exit_code != 0
    assert "--endpoint" in result.output


def test_prompts_fit_the_token_budget_and_differ() -> None:
    bodies = request_bodies("native", 200, 8)
    assert len(set(bodies)) == len(bodies) > 1
    first = json.loads(bodies[0])
    assert first["max_tokens"] == 8 and "text" in first


@pytest.mark.skipif(shutil.which("wrk") is None, reason="needs wrk (Debian: apt-get install wrk)")
def test_with_wrk_as_the_client_every_request_is_rejected_early_and_recorded() -> None:
    args = ["bench", "admission", "--client", "wrk", "--duration-s", "2", "--concurrency", "8"]
    result = runner.invoke(app, [*args, "--warmup-s", "1", "--prompt-tokens", "600", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["client"] == "wrk" and report["num_requests"] > 0
    assert report["all_rejected_early"] is True
    assert report["num_rejected_early"] == report["num_requests"]
    # wrk drops what is in flight when its time is up: the server recorded those too.
    sent = report["num_requests"] + report["num_warmup_requests"]
    assert report["num_recorded_rejected_early"] == report["num_recorded_requests"] >= sent
    assert 0 < report["p50_ms"] <= report["p90_ms"] <= report["p99_ms"] <= report["max_ms"]
    assert report["health"]["statuses"] == {"2xx": report["health"]["num_requests"]}


def test_a_missing_or_unknown_client_is_one_error_line() -> None:
    result = runner.invoke(app, ["bench", "admission", "--client", "ab", "--json"])
    assert result.exit_code == 2
    assert "client must be one of httpx, wrk" in result.output


def test_the_mixed_load_serves_some_refuses_the_rest_and_probes_health() -> None:
    args = ["bench", "admission", "--load", "mixed", "--duration-s", "2", "--warmup-s", "0.5"]
    args += ["--concurrency", "20", "--think-s", "0.2", "--prompt-tokens", "600", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["load"] == "mixed" and report["concurrency"] == 20
    rejected, served, health = report["rejected_early"], report["served"], report["health"]
    # Every answer is a 200 or a 429 at admission (the clients check each body).
    assert report["other_statuses"] == {}
    assert served["num_requests"] + rejected["num_requests"] > 0
    assert health["num_requests"] > 0 and health["statuses"] == {"200": health["num_requests"]}
    # The database holds every request the clients saw answered (and the warm-up's).
    assert report["num_recorded_requests"] >= served["num_requests"] + rejected["num_requests"]
    assert report["ttft_slo_s"] > 0 and report["tbt_slo_s"] > 0
