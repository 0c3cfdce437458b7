"""`kvcentric replay` against a real stack: runtime, 2 prefill + 1 decode tiny agents and
uvicorn on a loopback port, as in tests/api/test_routes_e2e.py."""

import asyncio
import io
import json
import socket
from itertools import islice

import aiohttp
import pytest
from typer.testing import CliRunner

from backend.cli import app as cli_app
from backend.loadgen.client import send_request
from backend.loadgen.plan import PlannedRequest
from backend.traces import SHIPPED_TRACE
from tests.harness.stack import runtime_stack
from tests.runtime.conftest import COST, make_settings

API_KEY = "api-key-0123456789"
NUM_ROWS = 20
TERMINAL = {"completed", "rejected", "failed", "http_error"}


@pytest.fixture(scope="module")
def url():
    with runtime_stack(make_settings(), ["prefill", "prefill", "decode"], COST) as stack:
        yield stack.url


@pytest.fixture
def short_trace(tmp_path):
    path = tmp_path / "trace.jsonl"
    with open(SHIPPED_TRACE) as shipped:
        path.write_text("".join(islice(shipped, NUM_ROWS)))
    return path


def _replay(*args: str):
    return CliRunner().invoke(cli_app, ["replay", "--api-key", API_KEY, *args])


def test_a_short_replay_leaves_one_terminal_line_per_request(url, short_trace, tmp_path):
    out = tmp_path / "results.jsonl"
    result = _replay(
        "--url", url, "--trace", str(short_trace), "--out", str(out),
        "--speed", "20", "--length-scale", "0.02", "--max-tokens-cap", "8",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(record["line"] for record in records) == list(range(1, NUM_ROWS + 1))
    assert {record["status"] for record in records} <= TERMINAL
    completed = [record for record in records if record["status"] == "completed"]
    assert completed, records
    for record in completed:
        assert record["ttft_s"] > 0 and record["id"]
        assert record["num_tokens"] == record["max_tokens"]
        if record["num_tokens"] > 1:
            assert record["tbt"]["max_s"] >= record["tbt"]["mean_s"] > 0
    for record in records:
        if record["status"] == "rejected":
            assert record["reason"] and record["stage"] and record["retry_after_s"] > 0
    assert f"{NUM_ROWS} requests" in result.stdout and "TTFT" in result.stdout


def test_a_bad_trace_line_exits_2_naming_file_and_line(tmp_path):
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n')
    trace.write_text(trace.read_text() + "{not json\n")
    result = _replay("--url", "http://127.0.0.1:9", "--trace", str(trace), "--out", "x.jsonl")
    assert result.exit_code == 2
    assert f"{trace}:2:" in result.stderr


def test_an_unreadable_trace_exits_2(tmp_path):
    result = _replay(
        "--url", "http://127.0.0.1:9", "--trace", str(tmp_path / "nope.jsonl"), "--out", "x"
    )
    assert result.exit_code == 2
    assert "cannot read the trace" in result.stderr


def test_an_unreachable_url_exits_2_with_one_line(short_trace, tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        result = _replay(
            "--url", f"http://127.0.0.1:{port}", "--trace", str(short_trace),
            "--out", str(tmp_path / "r.jsonl"), "--wait-s", "0",
        )  # fmt: skip
        assert result.exit_code == 2
        assert "cannot reach" in result.stderr and len(result.stderr.strip().splitlines()) == 1
        # A stack still starting is waited for (--wait-s, 60 s by default), saying so once.
        waited = _replay(
            "--url", f"http://127.0.0.1:{port}", "--trace", str(short_trace),
            "--out", str(tmp_path / "r.jsonl"), "--wait-s", "1",
        )  # fmt: skip
    assert waited.exit_code == 2
    first, last = waited.stderr.strip().splitlines()
    assert first.startswith("cannot reach") and first.endswith("; waiting up to 1 s")
    assert last.startswith("error: cannot reach")


def test_a_wrong_api_key_exits_2(url, short_trace, tmp_path):
    result = CliRunner().invoke(
        cli_app,
        ["replay", "--url", url, "--trace", str(short_trace), "--out", str(tmp_path / "r"),
         "--api-key", "wrong-key-0123456789"],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "401" in result.stderr


def test_an_early_rejection_is_recorded_with_reason_stage_and_retry_after(url):
    body = {"hash_ids": [1, 2, 3, 4], "input_length": 2000, "max_tokens": 2, "stream": True}
    planned = PlannedRequest(line_number=7, send_at_s=0.0, body={**body, "ttft_slo_s": 1e-6})

    async def send():
        headers = {"Authorization": f"Bearer {API_KEY}"}
        async with aiohttp.ClientSession(base_url=url, headers=headers) as client:
            return await send_request(client, planned, sent_s=0.0)

    result = asyncio.run(send())
    assert result.status == "rejected", result
    assert result.stage == "admission" and result.reason and result.retry_after_s > 0
    assert result.http_status == 429 and result.id and result.line == 7


def test_a_conductor_behind_a_path_prefix_is_replayed_through_it(url):
    """A reverse proxy (the outside world, faked) serves the real Conductor under /kvc/:
    the replay keeps the prefix of its URL on every request."""
    from aiohttp import ClientSession, web

    from backend.loadgen.replay import replay

    async def forward(request: web.Request) -> web.StreamResponse:
        target = url + request.path.removeprefix("/kvc")
        kept = {k: request.headers[k] for k in ("Authorization", "Content-Type")}
        body = await request.read()
        async with (
            ClientSession() as upstream,
            upstream.post(target, data=body, headers=kept) as answer,
        ):
            response = web.StreamResponse(
                status=answer.status, headers={"Content-Type": answer.content_type}
            )
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            return response

    async def run():
        app = web.Application()
        app.router.add_post("/kvc/{tail:.*}", forward)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        body = {"hash_ids": [1], "input_length": 40, "max_tokens": 3, "stream": True}
        planned = [PlannedRequest(line_number=1, send_at_s=0.0, body=body)]
        try:
            return [
                await replay(f"http://127.0.0.1:{port}{prefix}", API_KEY, planned, io.StringIO())
                for prefix in ("/kvc", "/kvc/")  # with or without its trailing slash
            ]
        finally:
            await runner.cleanup()

    for run_ in asyncio.run(run()):
        (result,) = run_.results
        assert (result.status, result.num_tokens) == ("completed", 3), result
