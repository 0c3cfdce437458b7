"""SIGKILL of the Conductor (`kvcentric conductor`, SQLite) while requests stream, and a
restart on the same database: the agents drop the dead Conductor's decodes at once, the
new Conductor ends every request its predecessor left open (`failed`, conductor_restart),
the agents rejoin and announce the blocks they hold, and serving goes on."""

import os
import subprocess
import threading
import time

import httpx

from backend.cli.children import free_port
from backend.rpc import agent_pb2 as pb
from tests.harness.agents import KVCENTRIC, AgentProcess, stop_agents, wait_all

SECRET = "restart-test-secret-0123"
API_KEY = "api-key-0123456789"
HEADERS = {"x-api-key": API_KEY}
LONG = 20_000  # output tokens: the streams are still running when the Conductor dies
NUM_STREAMS = 3


class ConductorProcess:
    def __init__(self, database: str, http_port: int, grpc_port: int) -> None:
        env = {key: value for key, value in os.environ.items() if not key.startswith("KVC_")}
        env.update(
            KVC_API_KEYS=f"test:{API_KEY}",
            KVC_ADMIN_TOKEN="admin-token-0123456789",
            KVC_AGENT_SECRET=SECRET,
            KVC_DATABASE_URL=database,
            KVC_MAX_OUTPUT_TOKENS=str(LONG),
            KVC_REJECTION_POLICY="none",
            KVC_BLOCK_SIZE="64",  # the agents' default
            KVC_HEARTBEAT_INTERVAL_S="0.2",
            KVC_HEARTBEAT_TIMEOUT_S="2",
        )
        args = [KVCENTRIC, "conductor", "--port", str(http_port), "--grpc-port", str(grpc_port)]
        self.process = subprocess.Popen(
            [*args, "--profile", "tiny-cpu"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stderr: list[str] = []
        threading.Thread(
            target=lambda: self.stderr.extend(self.process.stderr), daemon=True
        ).start()
        self.url = f"http://127.0.0.1:{http_port}"

    def wait_for_agents(self, count: int, timeout_s: float = 60.0) -> list[dict]:
        deadline_s = time.monotonic() + timeout_s
        while time.monotonic() < deadline_s:
            assert self.process.poll() is None, "".join(self.stderr[-50:])
            try:
                agents = httpx.get(f"{self.url}/v1/agents", headers=HEADERS, timeout=2).json()
                if isinstance(agents, list) and len(agents) == count:
                    return agents
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{count} agents did not join: {''.join(self.stderr[-50:])}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()


def _stream(url: str, first_tokens: list[str], ended: list[str]) -> None:
    """Read one long stream until the Conductor dies under it."""
    body = {"model": "tiny", "prompt": "a long prompt to decode from " * 8, "max_tokens": LONG}
    try:
        with httpx.stream(
            "POST", f"{url}/v1/completions", json={**body, "stream": True}, headers=HEADERS,
            timeout=30,
        ) as response:  # fmt: skip
            for line in response.iter_lines():
                if line.startswith('data: {"id"'):
                    first_tokens.append(line[:80])
    except httpx.HTTPError as error:
        ended.append(type(error).__name__)


def _request_ids(lines: list[str]) -> set[str]:
    return {line.split('"id":"', 1)[1].split('"', 1)[0] for line in lines}


def test_a_killed_conductor_leaves_no_open_request_and_its_agents_drop_its_work(tmp_path):
    database = f"sqlite:///{tmp_path / 'conductor.db'}"
    http_port, grpc_port = free_port(), free_port()
    conductor = ConductorProcess(database, http_port, grpc_port)
    extra = ("--conductor", f"127.0.0.1:{grpc_port}", "--heartbeat-interval-s", "0.2")
    agents = wait_all(
        [AgentProcess("prefill", SECRET, *extra), AgentProcess("decode", SECRET, *extra)]
    )
    restarted = None
    try:
        conductor.wait_for_agents(2)
        decode = agents[1]
        lines: list[list[str]] = [[] for _ in range(NUM_STREAMS)]
        ended: list[str] = []
        threads = [
            threading.Thread(target=_stream, args=(conductor.url, lines[i], ended), daemon=True)
            for i in range(NUM_STREAMS)
        ]
        for thread in threads:
            thread.start()
        deadline_s = time.monotonic() + 30
        while not all(len(chunks) >= 3 for chunks in lines):
            assert time.monotonic() < deadline_s, "the streams did not start"
            time.sleep(0.05)
        assert decode.stub.GetState(pb.GetStateRequest()).decode.batch_size == NUM_STREAMS

        conductor.process.kill()  # SIGKILL: no shutdown of any kind
        conductor.process.wait(10)
        killed_s = time.monotonic()
        while decode.stub.GetState(pb.GetStateRequest()).decode.batch_size:
            assert time.monotonic() - killed_s < 2.0, "the decode agent decodes for nobody"
            time.sleep(0.02)
        for thread in threads:
            thread.join(10)
        assert len(ended) == NUM_STREAMS  # every client saw its stream break

        restarted = ConductorProcess(database, http_port, grpc_port)
        joined = {agent["instance_id"]: agent for agent in restarted.wait_for_agents(2)}
        ids = set().union(*(_request_ids(chunks) for chunks in lines))
        assert len(ids) == NUM_STREAMS
        for request_id in ids:
            record = httpx.get(f"{restarted.url}/v1/requests/{request_id}", headers=HEADERS).json()
            assert record["state"] == "failed", record
            assert record["outcome"]["reason"] == "conductor_restart", record

        # The prefill agent's blocks are back in the new Conductor's index.
        prefill_id = agents[0].instance_id
        deadline_s = time.monotonic() + 10
        while True:
            view = next(
                agent
                for agent in httpx.get(f"{restarted.url}/v1/agents", headers=HEADERS).json()
                if agent["instance_id"] == prefill_id
            )
            held = view["load"]["num_dram_blocks"] + view["load"]["num_ssd_blocks"]
            if held and view["num_indexed_blocks"] == held:
                break
            assert time.monotonic() < deadline_s, (view, joined)
            time.sleep(0.1)
        answer = httpx.post(
            f"{restarted.url}/v1/completions",
            json={"model": "tiny", "prompt": "after the restart", "max_tokens": 4},
            headers=HEADERS,
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
    finally:
        conductor.stop()
        if restarted is not None:
            restarted.stop()
        stop_agents(agents)
