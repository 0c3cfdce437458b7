"""AgentProcess: a `kvcentric agent` subprocess on loopback, with a gRPC stub to drive it.

Ports are picked by the agent itself (port 0); the harness reads them from its 'ready'
line, so parallel test runs never collide.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc

from backend.policy.effects import CachePlan
from backend.rpc import agent_pb2 as pb
from backend.rpc import agent_pb2_grpc as pb_grpc
from backend.rpc.auth import call_metadata
from backend.rpc.convert import cache_plan_to_proto

KVCENTRIC = str(Path(sys.executable).parent / "kvcentric")
_READY = re.compile(r"ready: id=(\S+) role=\S+ control=(\S+) data=(\S+)")


_STARTED: list[subprocess.Popen] = []


def kill_leftover_agents() -> int:
    """Kill agents a test left running (a fixture that failed before its teardown); returns
    how many. Called once at the end of the test session."""
    leftovers = [process for process in _STARTED if process.poll() is None]
    for process in leftovers:
        process.kill()
        process.wait(10)
    return len(leftovers)


class AgentProcess:
    """One running agent; `stub` calls it with the secret, `bare_stub` without."""

    def __init__(
        self,
        role: str,
        secret: str,
        *extra: str,
        block_size: int = 64,
        env: dict[str, str] | None = None,
        model: str = "tiny",
    ) -> None:
        self.secret = secret
        args = [
            KVCENTRIC, "agent", "--role", role, "--listen", "127.0.0.1:0",
            "--data-listen", "127.0.0.1:0", "--model", model,
            "--block-size", str(block_size), "--secret", secret, *extra,
        ]  # fmt: skip
        self.process = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **env} if env else None,
        )
        _STARTED.append(self.process)
        self.stderr_lines: list[str] = []
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self.instance_id = self.control_address = self.data_address = ""

    def _drain_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr_lines.append(line)

    def wait_ready(self) -> "AgentProcess":
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        match = _READY.search(line)
        if match is None:
            self.process.kill()
            raise RuntimeError(f"agent did not start: {line!r} {''.join(self.stderr_lines)}")
        self.instance_id, self.control_address, self.data_address = match.groups()
        self.channel = grpc.insecure_channel(self.control_address)
        self.bare_stub = pb_grpc.AgentStub(self.channel)
        self.stub = _WithSecret(self.bare_stub, call_metadata(self.secret))
        return self

    def terminate(self, timeout_s: float = 45.0) -> int:
        """SIGTERM, then the exit code. An agent still running after `timeout_s` (more than
        its 30 s drain) is made to write its threads' stacks, killed, and reported with
        the end of its stderr."""
        self.process.terminate()
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGUSR1)  # faulthandler: every thread's stack
            time.sleep(1.0)
            self.process.kill()
            self.process.wait(10)
            tail = "".join(self.stderr_lines[-200:])
            raise AssertionError(
                f"agent {self.instance_id} still running {timeout_s:.0f} s after SIGTERM; "
                f"its stderr ends:\n{tail}"
            ) from None
        finally:
            if self.process.poll() is None:
                self.process.kill()
            self.channel.close()


class _WithSecret:
    """A stub whose every call carries the secret."""

    def __init__(self, stub: pb_grpc.AgentStub, metadata: tuple[tuple[str, str], ...]) -> None:
        self._stub = stub
        self._metadata = metadata

    def __getattr__(self, name: str):
        method = getattr(self._stub, name)
        return lambda request, **kwargs: method(request, metadata=self._metadata, **kwargs)


def start_agents(roles: list[str], secret: str, *extra: str) -> list[AgentProcess]:
    """Start all at once (model builds overlap), then wait for each."""
    return wait_all([AgentProcess(role, secret, *extra) for role in roles])


def wait_all(agents: list[AgentProcess]) -> list[AgentProcess]:
    """Wait for agents started together; if one fails to start, stop the others first."""
    try:
        return [agent.wait_ready() for agent in agents]
    except BaseException:
        for agent in agents:
            agent.process.kill()
        raise


def stop_agents(agents: list[AgentProcess]) -> None:
    """SIGTERM every agent still running at once (teardowns overlap), then wait for each."""
    running = [agent for agent in agents if agent.process.poll() is None]
    for agent in running:
        agent.process.terminate()
    for agent in running:
        agent.terminate()


def prefill_request(
    request_id: str,
    tokens: list[int],
    plan: CachePlan = CachePlan((), None, 0, 0),
    data_addresses: dict[str, str] | None = None,
    *,
    decode_address: str = "",
    replicate: bool = False,
) -> pb.DispatchPrefillRequest:
    """A DispatchPrefill asking for the logits; `data_addresses` resolves the plan's fetch."""
    return pb.DispatchPrefillRequest(
        request_id=request_id,
        token_ids=tokens,
        plan=cache_plan_to_proto(plan, data_addresses or {}),
        replicate=replicate,
        decode_data_address=decode_address,
        return_logits=True,
    )
