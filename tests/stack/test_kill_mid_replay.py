"""SIGKILL of a prefill agent in the middle of a trace replay through the REST API: every
request ends in exactly one recorded terminal state, and the cluster keeps serving.

Real processes throughout: the Conductor (`kvcentric conductor`'s start path, SQLite, wall
clock) served by uvicorn, 2 prefill + 1 decode `tiny` agents, and the load generator's own
replay (`backend.loadgen`) of the shipped trace, length-scaled."""

import asyncio
import io
import threading
import time

from backend.cli.children import free_port
from backend.db import request_log
from backend.loadgen.plan import ReplayConfig, plan_requests
from backend.loadgen.replay import replay
from backend.traces import SHIPPED_TRACE
from backend.traces.loader import load_trace
from tests.harness.stack import conductor_stack
from tests.runtime.conftest import make_settings

API_KEY = "api-key-0123456789"
KILL_AFTER_S = 3.0


def test_sigkill_of_an_agent_mid_replay_ends_every_request_once(tmp_path) -> None:
    settings = make_settings(
        database_url=f"sqlite:///{tmp_path / 'conductor.db'}",
        grpc_port=free_port(),
        heartbeat_timeout_s=2.0,
        rejection_policy="none",  # every refusal here is the kill's doing, not admission's
    )
    with conductor_stack(settings, ["prefill", "prefill", "decode"], profile="tiny-cpu") as stack:
        runtime, url, agents = stack.runtime, stack.url, stack.agents
        rows = load_trace(SHIPPED_TRACE, minutes=(0, 1.0))
        planned = plan_requests(rows, ReplayConfig(speed=6.0, length_scale=0.02))

        victim = agents[0]
        killed_at: list[float] = []

        def kill_later() -> None:
            time.sleep(KILL_AFTER_S)
            victim.process.kill()  # SIGKILL: no final heartbeat, no drain
            killed_at.append(time.time())

        threading.Thread(target=kill_later, daemon=True).start()
        started_s = time.time()
        run = asyncio.run(replay(url, API_KEY, planned, io.StringIO()))

        assert killed_at and killed_at[0] < started_s + run.duration_s, "killed after the end"
        results = run.results
        assert len(results) == len(planned)
        statuses = {r.status for r in results}
        assert statuses <= {"completed", "failed", "rejected"}, [
            (r.status, r.http_status, r.message) for r in results if r.status == "http_error"
        ]
        # The cluster kept serving: requests sent after the kill completed.
        after = [r for r in results if started_s + r.sent_s > killed_at[0] + 1.0]
        assert after and sum(r.status == "completed" for r in after) >= len(after) // 2
        assert victim.instance_id not in runtime.agents()
        # Every request the Conductor took has exactly one recorded terminal state.
        assert runtime.flush_records()
        with stack.app.state.sessions() as session:
            recorded = request_log.list_requests(
                session=session, start_s=started_s - 1, end_s=time.time() + 1
            )
        assert len(recorded) == len(results)
        assert all(r.outcome is not None for r in recorded)
        by_id = {r.request_id: r.outcome.state for r in recorded}
        assert {r.id: r.status for r in results} == by_id
