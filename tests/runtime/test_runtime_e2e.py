"""The runtime over real agent processes (2 prefill + 1 decode, tiny preset) that join it
and heartbeat to it; the reference is a single-process run of the same seeded model."""

import time

import numpy as np
import pytest
import torch

from agents.model import PagedKv, build_model
from agents.workers import DecodeRequest, DecodeWorker
from backend.db import request_log
from backend.policy import block_keys
from backend.runtime import ConductorRuntime
from tests.harness.agents import AgentProcess, stop_agents, wait_all
from tests.runtime.conftest import BLOCK, COST, SECRET, make_settings

MAX_TOKENS = 6


@pytest.fixture
def cluster(sessions):
    runtime = ConductorRuntime(
        make_settings(), COST, session_factory=sessions, grpc_address="127.0.0.1:0"
    ).start()
    extra = ("--conductor", runtime.address)
    agents = wait_all(
        [AgentProcess(role, SECRET, *extra) for role in ("prefill", "prefill", "decode")]
    )
    deadline = time.monotonic() + 30
    while len(runtime.agents()) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(runtime.agents()) == 3
    yield runtime, agents
    stop_agents(agents)
    runtime.stop()


@pytest.fixture(scope="module")
def model():
    return build_model("tiny", seed=0, device="cpu")


def _reference(model, tokens: list[int]) -> list[int]:
    logits, kv = model.full_prefill(torch.tensor(tokens))
    outputs: list[int] = []
    worker = DecodeWorker(model, on_token=lambda _, token, __: outputs.append(token))
    worker.submit(
        DecodeRequest("ref", PagedKv.from_layers(kv, BLOCK), int(torch.argmax(logits)), MAX_TOKENS)
    )
    worker.run_until_idle()
    return outputs


def _prompt(seed: int, shared: np.ndarray, tail: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [*shared.tolist(), *rng.integers(0, 32_000, tail).tolist()]


def test_requests_complete_reuse_prefixes_and_survive_a_killed_agent(cluster, model, sessions):
    runtime, agents = cluster
    shared = np.random.default_rng(0).integers(0, 32_000, 3 * BLOCK)
    first, second = _prompt(1, shared, 10), _prompt(2, shared, 20)

    r1 = runtime.submit("r1", first, MAX_TOKENS)
    assert list(r1) == _reference(model, first)
    assert r1.result(30).state == "completed"
    holder = r1.decisions[0].instance_id

    r2 = runtime.submit("r2", second, MAX_TOKENS)
    assert r2.result(30).state == "completed"
    assert r2.tokens == _reference(model, second)
    plan = r2.decisions[0].plan
    assert r2.decisions[0].instance_id == holder  # cached locally: cheaper than a fetch
    assert plan.local_keys == tuple(block_keys(second, BLOCK)[:3])
    assert plan.num_reused_tokens == 3 * BLOCK and r2.num_reused_tokens == 3 * BLOCK

    victim = next(agent for agent in agents if agent.instance_id == holder)
    victim.process.kill()  # SIGKILL: no final heartbeat, no drain
    victim.process.wait(10)
    r3 = runtime.submit("r3", _prompt(3, shared, 30), MAX_TOKENS)  # routed to the dead holder
    outcome3 = r3.result(30)
    assert outcome3.state == "failed" and holder in (outcome3.reason or "")
    assert holder not in runtime.agents()

    third = _prompt(4, shared, 40)
    r4 = runtime.submit("r4", third, MAX_TOKENS)
    assert r4.result(30).state == "completed"
    assert r4.tokens == _reference(model, third)
    assert r4.decisions[0].instance_id != holder

    assert runtime.flush_records()  # the request log is written behind
    with sessions() as session:
        records = {
            rid: request_log.get_request(session=session, request_id=rid)
            for rid in ("r1", "r2", "r3", "r4")
        }
        assert {rid: rec.outcome.state for rid, rec in records.items()} == {
            "r1": "completed", "r2": "completed", "r3": "failed", "r4": "completed",
        }  # fmt: skip
        assert records["r2"].outcome.num_reused_tokens == 3 * BLOCK
        assert len(request_log.list_decisions(session=session, request_id="r2")) == 1


def test_a_prefix_cached_on_a_busy_agent_is_fetched_by_another_and_the_kv_moves(cluster, model):
    runtime, _ = cluster
    shared = np.random.default_rng(10).integers(0, 32_000, 3 * BLOCK)
    first, second = _prompt(11, shared, 10), _prompt(12, shared, 20)
    r1 = runtime.submit("t1", first, MAX_TOKENS)
    assert r1.result(30).state == "completed"
    holder = r1.decisions[0].instance_id
    keys = tuple(block_keys(second, BLOCK)[:3])
    deadline = time.monotonic() + 10  # the holder's KvStored events arrive by heartbeat
    while runtime.core.index.prefix_blocks(keys, [holder])[holder] < 3:
        assert time.monotonic() < deadline, "the holder's blocks never reached the index"
        time.sleep(0.05)
    # Make the holder look busy (ten seconds of predicted queue), as a long prefill would:
    # Algorithm 1 then sends the next request to the idle instance with a fetch.
    with runtime.locked():
        runtime.core.prefill[holder].enqueue("ballast", 10.0)
    try:
        r2 = runtime.submit("t2", second, MAX_TOKENS)
        assert r2.result(30).state == "completed"
    finally:
        with runtime.locked():
            runtime.core.prefill[holder].dequeue("ballast")

    decision = r2.decisions[0]
    assert decision.instance_id != holder
    assert decision.plan.fetch is not None
    assert decision.plan.fetch.source_instance_id == holder
    assert decision.plan.fetch.keys == keys
    # The fetching agent really received the three blocks: it reused them instead of
    # computing them, and the tokens equal a single-process run's.
    assert r2.num_fetched_tokens == 3 * BLOCK and r2.num_reused_tokens == 3 * BLOCK
    assert r2.tokens == _reference(model, second)
    # The copy it kept (a replica) reached the index: both instances hold the prefix now.
    deadline = time.monotonic() + 10
    while runtime.core.index.num_replicas(keys[0]) < 2:
        assert time.monotonic() < deadline, "the replica never reached the index"
        time.sleep(0.05)
    # The fetching agent measured the fetch for the calibration (the live profile's link is
    # fitted from these), by heartbeat.
    deadline = time.monotonic() + 10
    while not (fetches := [s for s in runtime.calibrator.prefill if s.fetched_tokens]):
        assert time.monotonic() < deadline, "the fetch never reached the calibration"
        time.sleep(0.05)
    assert fetches[0].fetched_tokens == 3 * BLOCK
    assert 0 < fetches[0].fetch_s < fetches[0].seconds


def test_the_core_sees_each_agents_backlog_one_prefill_running_at_a_time(cluster):
    """An agent prefills one request at a time: the core must see the others queued behind
    it (T_queue counts them), not running side by side from the moment they were sent."""
    runtime, _ = cluster
    prompts = [_prompt(100 + n, np.zeros(0, dtype=int), 40 * BLOCK) for n in range(8)]
    streams = [runtime.submit(f"burst{n}", prompt, 2) for n, prompt in enumerate(prompts)]
    seen_queued = False
    while not all(stream.is_finished for stream in streams):
        with runtime.locked():
            for state in runtime.core.prefill.values():
                assert len(state.running) <= 1, state.running
                seen_queued = seen_queued or bool(state.queued_s)
        time.sleep(0.002)
    assert all(stream.result(30).state == "completed" for stream in streams)
    assert seen_queued  # eight prompts to two agents: some waited in line


def test_a_dead_decode_agent_costs_no_request_and_never_expels_a_prefill_agent(sessions):
    """A decode agent dies unnoticed (the heartbeat timeout is long): a prefill whose KV
    hand-off to it fails answers ABORTED, which used to fail the request (and before that
    expelled the healthy prefill agent). Now the runtime finds the decode agent gone, takes
    it out and places the request again: every request completes, prefill agents stay."""
    runtime = ConductorRuntime(
        make_settings(heartbeat_timeout_s=60.0),
        COST,
        session_factory=sessions,
        grpc_address="127.0.0.1:0",
    ).start()
    extra = ("--conductor", runtime.address)
    roles = ("prefill", "prefill", "decode", "decode")
    agents = wait_all([AgentProcess(role, SECRET, *extra) for role in roles])
    try:
        deadline = time.monotonic() + 30
        while len(runtime.agents()) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        prefill_ids = {a.instance_id for a, r in zip(agents, roles, strict=True) if r == "prefill"}
        victim = agents[roles.index("decode")]
        victim.process.kill()
        victim.process.wait(10)
        shared = np.zeros(0, dtype=int)
        streams = [runtime.submit(f"k{n}", _prompt(200 + n, shared, 30), 4) for n in range(8)]
        outcomes = [stream.result(60) for stream in streams]
        assert [o.state for o in outcomes] == ["completed"] * 8, outcomes
        assert sum(stream.num_retries for stream in streams) >= 1  # some went to the dead one
        assert "a KV hand-off to it failed" in runtime.left()[victim.instance_id]
        assert prefill_ids <= set(runtime.agents())  # no prefill agent was thrown out
        after = runtime.submit("after", _prompt(300, shared, 30), 4)
        assert after.result(60).state == "completed"
    finally:
        stop_agents([a for a in agents if a is not victim])
        runtime.stop()


def test_a_finished_request_keeps_its_outcome_and_tokens_but_not_its_prompt(cluster):
    runtime, _ = cluster
    stream = runtime.submit("lean", _prompt(400, np.zeros(0, dtype=int), 500), 3)
    assert stream.result(30).state == "completed" and len(stream.tokens) == 3
    assert stream.token_ids == () and stream.block_keys == () and stream.token_times_s == []
