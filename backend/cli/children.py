"""The processes of a stack started from the command line (`kvcentric up`, `kvcentric bench
admission`): each child with its log, waiting until they are ready, stopping them in order.
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

KVCENTRIC = str(Path(sys.executable).parent / "kvcentric")
SECRET_BYTES = 32
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0


class ChildFailed(Exception):
    """A child exited (or never got ready) while the stack was starting."""


class Child:
    """One subprocess of the stack, its output in a log file."""

    def __init__(
        self, name: str, args: list[str], env: dict[str, str], log: Path, *, stdout_pipe: bool
    ) -> None:
        self.name = name
        self.log = log
        self._log_file: IO[str] = log.open("w")
        self.process = subprocess.Popen(
            args,
            stdout=subprocess.PIPE if stdout_pipe else self._log_file,
            stderr=self._log_file,
            stdin=subprocess.DEVNULL,
            env=env,
            text=True,
            # Its own session: Ctrl-C reaches `up` only, which stops the children in order.
            start_new_session=True,
        )

    def check_alive(self) -> None:
        code = self.process.poll()
        if code is not None:
            raise ChildFailed(f"{self.name} exited with code {code}; see its log {self.log}")

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()

    def wait(self) -> None:
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log_file.close()


def agent_names(num_prefill: int, num_decode: int) -> list[tuple[str, str]]:
    """(role, instance id) of a stack's agents, each role numbered from 0."""
    return [("prefill", f"prefill-{i}") for i in range(num_prefill)] + [
        ("decode", f"decode-{i}") for i in range(num_decode)
    ]


def agent_child(
    role: str,
    instance_id: str,
    *,
    block_size: int,
    conductor: str,
    env: dict[str, str],
    logs: Path,
    torch_threads: int | None = None,
    model: str = "tiny",
) -> Child:
    """An agent serving `model` on free loopback ports that joins `conductor` ("host:port")."""
    args = [
        KVCENTRIC, "agent", "--role", role, "--listen", "127.0.0.1:0",
        "--data-listen", "127.0.0.1:0", "--model", model, "--instance-id", instance_id,
        "--block-size", str(block_size), "--conductor", conductor,
    ]  # fmt: skip
    if torch_threads is not None:
        args += ["--torch-threads", str(torch_threads)]
    return Child(
        f"agent {instance_id}", args, env, logs / f"agent-{instance_id}.log", stdout_pipe=False
    )


def shared_host_threads(num_agents: int) -> int:
    """Torch threads for each of `num_agents` agents on this machine: its cores split
    between them (measured: 3 agents on 2 cores at 2 threads each made decode steps ~3x
    slower than at 1, docs/benchmarks.md)."""
    return max(1, (os.cpu_count() or 1) // num_agents)


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def get_json(url: str, api_key: str | None = None) -> object | None:
    """The JSON body of a 200 answer, else None (not answering yet)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=2) as r:
            return json.loads(r.read() or b"null") if r.status == 200 else None
    except (OSError, urllib.error.URLError, ValueError):
        return None


def answers(url: str) -> bool:
    """Whether `url` answers 200 (any body)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


def wait_for(what: str, ready, children: list[Child], timeout_s: float = START_TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while True:
        for child in children:
            child.check_alive()
        value = ready()
        if value:
            return value
        if time.monotonic() > deadline:
            raise ChildFailed(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.2)


def stop_stack(replay: Child | None, children: list[Child]) -> None:
    """The replay first, then the agents (at once), then the conductor."""
    if replay is not None:
        replay.terminate()
        replay.wait()
    agents, conductor = children[1:], children[:1]
    for group in (agents, conductor):
        for child in group:
            child.terminate()
        for child in group:
            child.wait()
