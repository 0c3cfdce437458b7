"""A whole stack for end-to-end tests: a Conductor (runtime and REST app), real agent
processes that join it, and uvicorn serving the app on a loopback port.

`conductor_stack` starts it the way `kvcentric conductor` does (database, wall clock);
`runtime_stack` without a database, on a given cost model. Both tear everything down when
the block ends, and also when starting it fails half-way (no agent process outlives it).
"""

import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI

from backend.api.app import create_app
from backend.cli.conductor_cmd import Conductor, start_conductor
from backend.policy import CostModel
from backend.runtime import ConductorRuntime
from backend.settings import ConductorSettings
from tests.harness.agents import AgentProcess, stop_agents, wait_all

JOIN_TIMEOUT_S = 30.0


@dataclass
class Stack:
    url: str  # the REST API, http://127.0.0.1:PORT
    runtime: ConductorRuntime
    app: FastAPI
    agents: list[AgentProcess]
    conductor: Conductor | None = None  # with a database (conductor_stack)


@contextmanager
def conductor_stack(
    settings: ConductorSettings, roles: Sequence[str], *, profile: str | None = None
) -> Iterator[Stack]:
    """`kvcentric conductor`'s start path (migrations, database, wall clock) and agents."""
    conductor = start_conductor(settings, profile=profile)
    try:
        with _agents_and_server(conductor.runtime, conductor.app, roles, settings) as stack:
            stack.conductor = conductor
            yield stack
    finally:
        conductor.stop()


@contextmanager
def runtime_stack(
    settings: ConductorSettings, roles: Sequence[str], cost: CostModel, *, model: str = "tiny"
) -> Iterator[Stack]:
    """A runtime without a database on `cost`, its app and agents serving `model`. The cost
    model stays `cost` (calibration measures but does not refit) unless the settings turn
    `calibrate` on."""
    if "calibrate" not in settings.model_fields_set:
        settings = settings.model_copy(update={"calibrate": False})
    runtime = ConductorRuntime(settings, cost, grpc_address="127.0.0.1:0").start()
    try:
        app = create_app(settings, runtime=runtime)
        with _agents_and_server(runtime, app, roles, settings, model) as stack:
            yield stack
    finally:
        runtime.stop()


@contextmanager
def _agents_and_server(
    runtime: ConductorRuntime,
    app: FastAPI,
    roles: Sequence[str],
    settings: ConductorSettings,
    model: str = "tiny",
) -> Iterator[Stack]:
    assert settings.agent_secret is not None
    secret = settings.agent_secret.get_secret_value()
    agents: list[AgentProcess] = []
    server: uvicorn.Server | None = None
    thread: threading.Thread | None = None
    try:
        agents = wait_all(
            [
                AgentProcess(role, secret, "--conductor", runtime.address, model=model)
                for role in roles
            ]
        )
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while len(runtime.agents()) < len(roles):
            assert time.monotonic() < deadline, f"{len(runtime.agents())} of {len(roles)} joined"
            time.sleep(0.05)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        while not server.started:
            assert thread.is_alive(), "uvicorn did not start"
            time.sleep(0.01)
        yield Stack(f"http://127.0.0.1:{sock.getsockname()[1]}", runtime, app, agents)
    finally:
        if server is not None and thread is not None:
            server.should_exit = True
            thread.join(10)
        stop_agents(agents)
