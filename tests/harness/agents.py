"""AgentProcess: a `kvcentric agent` subprocess on loopback, with a gRPC stub to drive it.

Ports are picked by the agent itself (port 0); the harness reads them from its 'ready'
line, so parallel test runs never collide.
"""

import re
import subprocess
import sys
import threading
from pathlib import Path

import grpc

from backend.rpc import agent_pb2_grpc as pb_grpc
from backend.rpc.auth import call_metadata

KVCENTRIC = str(Path(sys.executable).parent / "kvcentric")
_READY = re.compile(r"ready: id=(\S+) role=\S+ control=(\S+) data=(\S+)")


class AgentProcess:
    """One running agent; `stub` calls it with the secret, `bare_stub` without."""

    def __init__(self, role: str, secret: str, *extra: str, block_size: int = 64) -> None:
        self.secret = secret
        args = [
            KVCENTRIC, "agent", "--role", role, "--listen", "127.0.0.1:0",
            "--data-listen", "127.0.0.1:0", "--preset", "tiny",
            "--block-size", str(block_size), "--secret", secret, *extra,
        ]  # fmt: skip
        self.process = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
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

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, then the exit code."""
        self.process.terminate()
        try:
            return self.process.wait(timeout_s)
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


def start_agents(roles: list[str], secret: str) -> list[AgentProcess]:
    """Start all at once (model builds overlap), then wait for each."""
    agents = [AgentProcess(role, secret) for role in roles]
    return [agent.wait_ready() for agent in agents]
