"""The console's live endpoints over `kvcentric conductor`'s start path (SQLite file, wall
clock) and real agents (2 prefill + 1 decode, tiny preset): the window report, the cache
hot spots, agent rows and load samples in the database, and switching an agent's role."""

import socket
import time

import httpx
import pytest

from backend.db import cluster_log, config_store, request_log
from tests.harness.stack import conductor_stack
from tests.runtime.conftest import make_settings

KEY = {"Authorization": "Bearer api-key-0123456789"}
ADMIN = {"Authorization": "Bearer admin-token-0123456789"}
PREFIX = list(range(1, 257))  # four 64-token blocks shared by every prompt


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        grpc_port = probe.getsockname()[1]
    database = tmp_path_factory.mktemp("live") / "conductor.db"
    settings = make_settings(
        database_url=f"sqlite:///{database}",
        grpc_port=grpc_port,
        load_sample_interval_s=0.2,
        rejection_policy="early",
        ttft_slo_s=30.0,
        tbt_slo_s=5.0,
    )
    with conductor_stack(settings, ["prefill", "prefill", "decode"]) as stack:
        url = stack.url
        start_s = time.time()
        # Traffic: six prompts sharing a prefix (all but the first reuse it), two refused
        # at admission by an unreachable per-request TTFT SLO.
        for i in range(6):
            reply = httpx.post(
                f"{url}/v1/native/requests",
                json={"token_ids": [*PREFIX, 1000 + i, 7, 8], "max_tokens": 4},
                headers=KEY,
                timeout=60,
            )
            assert reply.status_code == 200, reply.text
        for i in range(2):
            reply = httpx.post(
                f"{url}/v1/native/requests",
                json={"token_ids": [2000 + i] * 80, "max_tokens": 4, "ttft_slo_s": 1e-6},
                headers=KEY,
                timeout=60,
            )
            assert reply.status_code == 429, reply.text
        time.sleep(0.6)  # a few load samples after the traffic
        yield url, stack.conductor, stack.agents, start_s


def test_the_report_counts_what_was_served(served):
    url, conductor, _, start_s = served
    report = httpx.get(
        f"{url}/v1/report", params={"start_s": start_s - 1, "end_s": time.time()}, headers=KEY
    ).json()
    assert report["num_requests"] == 8
    assert report["num_completed"] == 6 and report["num_rejected_admission"] == 2
    assert report["rejected_by_reason"] == {"admission:ttft_slo": 2}
    assert report["ttft_p50_s"] > 0 and report["tbt_p50_s"] > 0
    # Five of six prompts reused the 256-token prefix (within 259-token prompts).
    assert report["cache_hit_ratio"] == pytest.approx(5 * 256 / (6 * 259))
    assert report["reachable_hit_ratio"] >= report["cache_hit_ratio"]
    assert report["num_output_tokens"] == 6 * 4
    assert report["slo_attainment"] == pytest.approx(6 / 8)
    series = report["series"]
    num_windows = len(series["t_s"])
    assert sum(series["admitted"]) == 6 and sum(series["completed"]) == 6
    assert sum(series["rejected"]["admission:ttft_slo"]) == 2
    assert len(series["prefill_load"]) == len(series["decode_load"]) == num_windows
    # The records behind it: the same counts in the database.
    assert conductor.runtime.flush_records()
    with conductor.app.state.sessions() as session:
        records = request_log.list_requests(session=session, start_s=start_s - 1, end_s=time.time())
    assert sorted(r.outcome.state for r in records) == ["completed"] * 6 + ["rejected"] * 2


def test_load_samples_and_agent_rows_are_recorded(served):
    _, conductor, agents, start_s = served
    assert conductor.runtime.flush_records()
    with conductor.app.state.sessions() as session:
        rows = cluster_log.list_agents(session=session)
        samples = cluster_log.list_load_samples(session=session, start_s=start_s, end_s=time.time())
    assert {r.instance_id for r in rows} >= {a.instance_id for a in agents}
    assert all(r.state == "active" and r.last_heartbeat_time_s > start_s for r in rows)
    sampled = {s.instance_id for s in samples}
    assert sampled == {a.instance_id for a in agents}
    prefill_ids = {a.instance_id for a in agents[:2]}
    assert all((s.prefill_load_s is not None) == (s.instance_id in prefill_ids) for s in samples)
    assert any(s.memory_used_bytes for s in samples)


def test_the_cache_view_shows_the_shared_prefix_as_hottest(served):
    url, conductor, _, _ = served
    view = httpx.get(f"{url}/v1/cache", params={"limit": 4}, headers=KEY).json()
    hot = view["hot_blocks"]
    assert [b["depth"] for b in hot] == [0, 1, 2, 3]
    assert all(b["hits"] == 5 for b in hot)
    assert all(b["num_replicas"] == len(b["holders"]) >= 1 for b in hot)
    assert all(set(b["holders"].values()) <= {"dram", "ssd"} for b in hot)
    pools = {p["instance_id"]: p for p in view["instances"]}
    assert len(pools) == 3 and sum(p["dram_blocks"] for p in pools.values()) > 0
    assert view["num_indexed_blocks"] == len(conductor.runtime.core.index)


def test_bad_windows_and_missing_credentials_are_4xx(served):
    url, *_ = served
    assert httpx.get(f"{url}/v1/report").status_code == 401
    bad = httpx.get(f"{url}/v1/report", params={"start_s": 10, "end_s": 5}, headers=KEY)
    assert bad.status_code == 400 and "start_s < end_s" in bad.json()["error"]["message"]
    tiny = httpx.get(f"{url}/v1/report", params={"window_s": 86400, "interval_s": 1}, headers=KEY)
    assert tiny.status_code == 400 and "interval_s" in tiny.json()["error"]["message"]


def test_switching_a_role_drains_switches_audits_and_keeps_serving(served):
    url, conductor, agents, _ = served
    prefill, decode = agents[0].instance_id, agents[2].instance_id
    path = f"{url}/v1/admin/agents/{prefill}/role"
    assert httpx.post(path, json={"role": "decode"}, headers=KEY).status_code == 403
    missing = httpx.post(f"{url}/v1/admin/agents/nope/role", json={"role": "decode"}, headers=ADMIN)
    assert missing.status_code == 404
    last = httpx.post(
        f"{url}/v1/admin/agents/{decode}/role", json={"role": "prefill"}, headers=ADMIN
    )
    assert last.status_code == 409 and "last decode" in last.json()["error"]["message"]

    switched = httpx.post(path, json={"role": "decode"}, headers=ADMIN, timeout=60)

    assert switched.status_code == 200, switched.text
    assert switched.json()["role"] == "decode" and switched.json()["state"] == "active"
    assert set(conductor.runtime.core.decode) == {prefill, decode}
    body = {"token_ids": [5] * 70, "max_tokens": 3}
    reply = httpx.post(f"{url}/v1/native/requests", json=body, headers=KEY, timeout=60)
    assert reply.status_code == 200
    assert conductor.runtime.flush_records()
    with conductor.app.state.sessions() as session:
        audit = config_store.list_audit(session=session, start_s=None, end_s=None, limit=10)
        row = {r.instance_id: r for r in cluster_log.list_agents(session=session)}[prefill]
    assert audit[0].action == "agent.role" and audit[0].actor == "admin"
    assert audit[0].new_value == {"instance_id": prefill, "role": "decode"}
    assert row.role == "decode"
    back = httpx.post(path, json={"role": "prefill"}, headers=ADMIN, timeout=60)
    assert back.status_code == 200 and back.json()["role"] == "prefill"
