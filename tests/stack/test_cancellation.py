"""Requests that end early, through the REST API on a real stack (the Conductor's start path
with its database, a prefill and a decode `tiny` agent): a client that disconnects, a stop
sequence, the request deadline. Each ends in one recorded state with its reason, and its
decode slot is free within a second."""

import json
import time

import httpx
import pytest

from backend.cli.children import free_port
from backend.db import request_log
from backend.rpc import agent_pb2 as pb
from tests.harness.stack import conductor_stack
from tests.runtime.conftest import make_settings

API_KEY = "api-key-0123456789"
HEADERS = {"x-api-key": API_KEY}
LONG = 20_000  # output tokens: far more than any test waits for


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    database = tmp_path_factory.mktemp("cancel") / "conductor.db"
    settings = make_settings(
        database_url=f"sqlite:///{database}",
        grpc_port=free_port(),
        max_output_tokens=LONG,
        rejection_policy="none",
    )
    with conductor_stack(settings, ["prefill", "decode"], profile="tiny-cpu") as stack:
        yield stack


def _decode_agent(stack):
    return next(agent for agent in stack.agents if agent.instance_id.startswith("decode"))


def _wait_until_idle(stack, timeout_s: float) -> float:
    """Seconds until the decode agent's batch is empty; fails after `timeout_s`."""
    decode, started_s = _decode_agent(stack), time.monotonic()
    while (batch := decode.stub.GetState(pb.GetStateRequest()).decode.batch_size) != 0:
        assert time.monotonic() - started_s < timeout_s, f"batch still {batch} after {timeout_s} s"
        time.sleep(0.02)
    return time.monotonic() - started_s


def _stored_outcome(stack, request_id: str, timeout_s: float = 5.0):
    deadline_s = time.monotonic() + timeout_s
    while True:
        stack.runtime.flush_records()
        with stack.app.state.sessions() as session:
            record = request_log.get_request(session=session, request_id=request_id)
        if (record is not None and record.outcome is not None) or time.monotonic() > deadline_s:
            return record
        time.sleep(0.05)


def _body(**overrides) -> dict:
    return {"model": "tiny", "prompt": "a prompt long enough to span a block " * 4, **overrides}


def test_a_stream_closed_by_its_client_is_cancelled_and_frees_its_decode_slot(stack) -> None:
    body = _body(max_tokens=LONG, stream=True)
    with httpx.Client(base_url=stack.url, headers=HEADERS, timeout=30) as client:
        with client.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            chunks = []
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    chunks.append(json.loads(line[6:]))
                if len(chunks) == 3:
                    break
        request_id = chunks[0]["id"]
        closed_s = time.monotonic()
        assert _wait_until_idle(stack, timeout_s=1.0) < 1.0
        record = _stored_outcome(stack, request_id)
        assert record is not None and record.outcome is not None
        assert (record.outcome.state, record.outcome.reason) == ("cancelled", "client_disconnected")
        assert record.outcome.num_generated_tokens < LONG
        assert record.api_key_name == "test"
        # The cluster goes on serving.
        answer = client.post("/v1/completions", json=_body(max_tokens=4))
        assert answer.status_code == 200, answer.text
    assert time.monotonic() - closed_s < 30


def test_a_whole_answer_whose_client_gives_up_is_cancelled(stack) -> None:
    client = httpx.Client(base_url=stack.url, headers=HEADERS, timeout=1.0)
    with client, pytest.raises(httpx.ReadTimeout):
        client.post("/v1/completions", json=_body(max_tokens=LONG))
    assert _wait_until_idle(stack, timeout_s=2.0) < 2.0
    report = httpx.get(f"{stack.url}/v1/report", headers=HEADERS, params={"window_s": 600})
    assert report.json()["cancelled_by_reason"].get("client_disconnected", 0) >= 1


def test_a_stop_sequence_ends_the_decode_there(stack) -> None:
    with httpx.Client(base_url=stack.url, headers=HEADERS, timeout=60) as client:
        whole = client.post("/v1/completions", json=_body(max_tokens=40))
        text = whole.json()["choices"][0]["text"]
        words = text.split()
        assert len(words) > 6, text
        stop = words[5]  # greedy, so the same text comes again
        for stream in (False, True):
            body = _body(max_tokens=40, stop=[stop], stream=stream)
            if stream:
                with client.stream("POST", "/v1/completions", json=body) as response:
                    events = [
                        json.loads(line[6:])
                        for line in response.iter_lines()
                        if line.startswith("data: {")
                    ]
                cut = "".join(event["choices"][0]["text"] for event in events if event["choices"])
                reason = events[-1]["choices"][0]["finish_reason"]
                request_id = events[0]["id"]
            else:
                answer = client.post("/v1/completions", json=body).json()
                cut, reason = answer["choices"][0]["text"], answer["choices"][0]["finish_reason"]
                request_id = answer["id"]
                assert answer["usage"]["completion_tokens"] < 40
            assert (cut, reason) == (text[: text.index(stop)], "stop")
            record = _stored_outcome(stack, request_id)
            assert (record.outcome.state, record.outcome.reason) == ("completed", "stop_sequence")
            assert record.outcome.num_generated_tokens < 40
    assert _wait_until_idle(stack, timeout_s=1.0) < 1.0


def test_a_request_past_its_deadline_is_cancelled_with_504(stack) -> None:
    runtime = stack.runtime
    runtime.request_deadline_s = 1.0
    try:
        with httpx.Client(base_url=stack.url, headers=HEADERS, timeout=30) as client:
            started_s = time.monotonic()
            answer = client.post("/v1/completions", json=_body(max_tokens=LONG))
        assert answer.status_code == 504, answer.text
        assert answer.json()["error"]["code"] == "cancelled_deadline"
        assert time.monotonic() - started_s < 5
    finally:
        runtime.request_deadline_s = 600.0
    assert _wait_until_idle(stack, timeout_s=1.0) < 1.0
