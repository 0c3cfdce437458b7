"""Live-vs-twin parity items on real agents over `kvcentric conductor`'s start path: a decode
check set by PUT /v1/config reaches the decode agent, calibration converges on what real
agents measure and survives a restart, and GET /v1/calibration says when it has too few
points."""

import socket
import time

import httpx
import pytest

from backend.cli.conductor_cmd import start_conductor
from tests.harness.stack import conductor_stack
from tests.runtime.conftest import make_settings

KEY = {"Authorization": "Bearer api-key-0123456789"}
ADMIN = {"Authorization": "Bearer admin-token-0123456789"}


def _settings(tmp_path, **overrides):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        grpc_port = probe.getsockname()[1]
    return make_settings(
        database_url=f"sqlite:///{tmp_path / 'conductor.db'}",
        grpc_port=grpc_port,
        ttft_slo_s=60.0,
        tbt_slo_s=5.0,
        **overrides,
    )


def _post(url: str, tokens: list[int], max_tokens: int = 4) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/native/requests",
        json={"token_ids": tokens, "max_tokens": max_tokens},
        headers=KEY,
        timeout=60,
    )


def _submit(url: str, runtime, tokens: list[int], max_tokens: int = 4):
    reply = _post(url, tokens, max_tokens)
    assert reply.status_code == 200, reply.text
    return runtime.request(reply.json()["id"]).result(60)


def _put(url: str, **config) -> None:
    reply = httpx.put(f"{url}/v1/config", json={"config": config}, headers=ADMIN, timeout=10)
    assert reply.status_code == 200, reply.text


def test_a_decode_check_set_by_put_is_run_by_the_decode_agent(tmp_path) -> None:
    settings = _settings(tmp_path, rejection_policy="none", calibrate=False)
    with conductor_stack(settings, ["prefill", "decode"], profile="tiny-cpu") as stack:
        url, runtime = stack.url, stack.runtime
        assert _submit(url, runtime, list(range(1, 40))).state == "completed"
        # baseline admits on TTFT only; the decode agent's own check then refuses: no decode
        # step of the tiny-cpu model fits in a microsecond.
        _put(url, rejection_policy="baseline", tbt_slo_s=1e-6)
        reply = _post(url, list(range(2, 41)))
        assert reply.status_code == 429, reply.text
        error = reply.json()["error"]
        assert (error["stage"], error["reason"]) == ("decode", "tbt_slo")
        outcome = runtime.request(error["request_id"]).result(10)
        assert (outcome.state, outcome.stage, outcome.reason) == ("rejected", "decode", "tbt_slo")
        _put(url, rejection_policy="none")  # no check travels: the same SLO admits
        assert _submit(url, runtime, list(range(3, 42))).state == "completed"


def test_calibration_converges_on_real_agents_and_survives_a_restart(tmp_path) -> None:
    settings = _settings(
        tmp_path,
        calibration_min_prefill_points=6,
        calibration_min_decode_points=10,
        calibration_refit_interval_s=0.2,
        calibration_max_change_factor=1e4,
    )
    wrong = _a_hundred_times_too_fast(tmp_path)
    with conductor_stack(settings, ["prefill", "decode"], profile=wrong) as stack:
        url, runtime = stack.url, stack.runtime
        before = httpx.get(f"{url}/v1/calibration", headers=KEY, timeout=10).json()
        assert before["status"] == "profile"
        for i in range(12):
            prompt = [(7 * i + j) % 30_000 + 1 for j in range(30 + 20 * i)]
            assert _submit(url, runtime, prompt, max_tokens=6).state == "completed"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            view = httpx.get(f"{url}/v1/calibration", headers=KEY, timeout=10).json()
            if {"prefill", "decode"} <= set(view["updated"]):
                break
            time.sleep(0.2)
        assert view["status"] == "calibrated", view["notes"]
        base_error = _median_error(view["prefill"], before["base"])
        assert base_error > 0.8  # the profile was far off
        assert view["prefill_median_rel_err"] < min(0.25, base_error / 2), (view, base_error)
        assert view["decode_median_rel_err"] < 0.5
        assert view["profile"]["believed"] == view["believed"]
        assert runtime.core.cost.name == "calibrated-a-hundred-times-too-fast"
        # Each measurement says how much CPU its agent's thread got (host sharing's solo
        # times): some, and never more than the seconds it took.
        window = runtime.calibrator.snapshot()
        for sample in [*window.prefill, *window.decode]:
            assert sample.cpu_s is not None and 0 < sample.cpu_s <= sample.seconds, sample
        # The serving path to and from the prefill agent, split where the agent stamped its
        # answer (every answer after its first heartbeat gave the Conductor its clock).
        answers = [s.answer_s for s in window.serving if s.answer_s is not None]
        assert len(answers) >= len(window.serving) - 2 and answers, window.serving
        assert all(0.0 <= a < 1.0 for a in answers)
        assert all(s.dispatch_s >= 0.0 for s in window.serving)
    calibrated = runtime.core.cost  # as the stopped Conductor last saved it
    restarted = start_conductor(settings, profile=wrong)
    try:
        assert restarted.runtime.core.cost == calibrated
    finally:
        restarted.stop()


def test_a_real_conductor_refits_as_its_points_double_long_before_its_interval(tmp_path) -> None:
    """The growth rule on real agents: with an hour between interval refits, the prefill fit
    still follows the window as it grows (refitted once its points have doubled), so a
    young fit is never believed for long (at speed 8 a warm-up's first 20 prefills were)."""
    settings = _settings(
        tmp_path,
        calibration_min_prefill_points=4,
        calibration_min_decode_points=4,
        calibration_refit_interval_s=3600.0,
    )
    with conductor_stack(settings, ["prefill", "decode"], profile="tiny-cpu") as stack:
        url, runtime, calibrator = stack.url, stack.runtime, stack.runtime.calibrator
        for i in range(32):
            prompt = [(11 * i + j) % 30_000 + 1 for j in range(20 + 5 * i)]
            assert _submit(url, runtime, prompt, max_tokens=2).state == "completed"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the last measurements ride a heartbeat
            with runtime.locked():
                measured, fitted = len(calibrator.prefill), calibrator.fitted_points.copy()
            if measured >= 32 and measured < 2 * fitted.get("prefill", 0):
                break
            time.sleep(0.2)
        # Its first fits came from the first few prefills (the minimum, then serving's ten);
        # without the growth rule the last would stand until the hour was over.
        assert measured >= 32, measured
        assert fitted["prefill"] * 2 > measured, (fitted, measured)
        assert calibrator.num_refits >= 3, calibrator.num_refits


def _a_hundred_times_too_fast(folder) -> str:
    """The tiny-cpu profile's model believing every prefill and step a hundred times faster.

    A hundred, not ten: a machine a few times faster than the one tiny-cpu was measured on
    (a CI runner) would otherwise see a profile only ~4x too fast, and the test is about
    converging from far off."""
    import dataclasses
    import json

    from backend.cli.conductor_cmd import cost_model

    cost = cost_model("tiny-cpu")
    fast = dataclasses.replace(
        cost,
        prefill=type(cost.prefill)(*(v / 100 for v in dataclasses.astuple(cost.prefill))),
        decode=type(cost.decode)(*(v / 100 for v in dataclasses.astuple(cost.decode))),
        name="a-hundred-times-too-fast",
    )
    path = folder / "too-fast.json"
    path.write_text(json.dumps(fast.to_profile()))
    return str(path)


def _median_error(points: list[dict], profile: dict) -> float:
    from backend.policy import CostModel

    cost = CostModel.from_profile(profile)
    errors = sorted(
        abs(cost.prefill_time_s(p["input_tokens"], p["cached_tokens"]) - p["measured_s"])
        / p["measured_s"]
        for p in points
    )
    return errors[len(errors) // 2]


def test_too_few_points_keep_the_profile_and_the_response_says_so(tmp_path) -> None:
    with conductor_stack(_settings(tmp_path), ["prefill", "decode"], profile="tiny-cpu") as stack:
        url, runtime = stack.url, stack.runtime
        assert _submit(url, runtime, list(range(1, 50))).state == "completed"
        time.sleep(0.5)  # a heartbeat carries the measurements
        view = httpx.get(f"{url}/v1/calibration", headers=KEY, timeout=10).json()
    assert view["status"] == "profile" and view["believed"] == view["base"]
    assert any("prefill: 1 point(s) in the window, 20 needed" in n for n in view["notes"])
    assert view["window"]["num_prefill"] == 1 and len(view["prefill"]) == 1


@pytest.mark.parametrize("bad", ["-1", "4097", "x"])
def test_a_bad_max_points_is_a_4xx(tmp_path, bad) -> None:
    from fastapi.testclient import TestClient

    conductor = start_conductor(_settings(tmp_path), profile="tiny-cpu")
    try:
        with TestClient(conductor.app) as client:
            reply = client.get(f"/v1/calibration?max_points={bad}", headers=KEY)
        assert reply.status_code == 422 and reply.json()["error"]["message"]
    finally:
        conductor.stop()


def test_kv_events_reach_the_index_on_the_heartbeat_channel_before_the_answer(tmp_path) -> None:
    """One channel: the agent flushes a prefill's KV events in a heartbeat before it answers,
    so the index holds the prompt's blocks when the request's prefill is over, although the
    periodic heartbeat is far away and the events in the answer are no longer applied."""
    from backend.policy import block_keys
    from tests.runtime.conftest import BLOCK

    settings = _settings(tmp_path, heartbeat_interval_s=30.0, heartbeat_timeout_s=60.0)
    with conductor_stack(settings, ["prefill", "decode"], profile="tiny-cpu") as stack:
        url, runtime = stack.url, stack.runtime
        time.sleep(0.5)  # past the joins' first heartbeats; the next periodic one is 30 s off
        tokens = list(range(1, 4 * BLOCK + 5))
        assert _submit(url, runtime, tokens).state == "completed"
        keys = block_keys(tokens, BLOCK)
        (prefill_id,) = [i for i, a in runtime.agents().items() if a.join.role == "prefill"]
        with runtime.locked():
            held = runtime.core.index.prefix_blocks(keys, [prefill_id])
        assert held == {prefill_id: len(keys)}


def test_a_real_prefill_agent_measures_its_line_s_hand_over(tmp_path) -> None:
    """Prompts sent at once queue on the one prefill agent: those that waited for its worker
    report the hand-over from the one ahead (time no prefill's seconds hold), the first
    found it free and reports none."""
    from concurrent.futures import ThreadPoolExecutor

    settings = _settings(tmp_path, calibration_refit_interval_s=0.2)
    with conductor_stack(settings, ["prefill", "decode"]) as stack:
        url, runtime = stack.url, stack.runtime
        prompts = [[(11 * i + j) % 30_000 + 1 for j in range(400)] for i in range(6)]
        with ThreadPoolExecutor(len(prompts)) as pool:
            replies = list(pool.map(lambda p: _post(url, p, max_tokens=2), prompts))
        assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
        for reply in replies:
            assert runtime.request(reply.json()["id"]).result(60).state == "completed"
        deadline = time.monotonic() + 10
        while len(runtime.calibrator.snapshot().prefill) < len(prompts):
            assert time.monotonic() < deadline, "the prefills' samples never arrived"
            time.sleep(0.1)
        handovers = [s.handover_s for s in runtime.calibrator.snapshot().prefill]
    assert None in handovers  # the first found the worker free
    waited = [h for h in handovers if h is not None]
    assert waited and all(0.0 <= h < 1.0 for h in waited), handovers
