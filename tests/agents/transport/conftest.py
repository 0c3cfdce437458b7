"""Fixtures of the transport tests: the transport kinds available here and peer processes."""

import multiprocessing as mp
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import pytest

from agents.transport import Transport, make_transport
from agents.transport.mooncake_engine import mooncake_missing_reason
from tests.agents.transport import peers

MOONCAKE_MISSING = mooncake_missing_reason()
KINDS = [
    "tcp",
    pytest.param(
        "mooncake",
        marks=pytest.mark.skipif(MOONCAKE_MISSING is not None, reason=str(MOONCAKE_MISSING)),
    ),
]


@dataclass
class Peer:
    """A peer process, its address and the pipe to ask it things."""

    address: str
    pipe: Connection
    process: mp.process.BaseProcess

    def ask(self, *request: Any) -> Any:
        self.pipe.send(request)
        return self.pipe.recv()

    def stop(self) -> None:
        self.pipe.send(("stop",))
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()


def spawn_peer(target: Callable[..., None], *args: Any) -> Peer:
    context = mp.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=target, args=(child, *args), daemon=True)
    process.start()
    if not parent.poll(30):
        process.kill()
        raise RuntimeError(f"peer process {target.__name__} did not start")
    return Peer(parent.recv(), parent, process)


@pytest.fixture(scope="module", params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def server(kind: str) -> Iterator[Peer]:
    """An honest agent process serving peers.make_blocks() with the transport `kind`."""
    peer = spawn_peer(peers.serve_blocks, kind)
    yield peer
    peer.stop()


@pytest.fixture(scope="module")
def client(kind: str) -> Iterator[Transport]:
    """One requester per kind and module: a Mooncake engine takes a second to tear down."""
    transport = make_transport(kind, secret=peers.SECRET)
    yield transport
    transport.close()
