"""ConnectionPool: a few authenticated connections per peer, reused across requests.

A connection is checked out for one request-reply exchange and comes back afterwards if
the frame stream is still in step (a reply, or an error frame about some blocks); after a
link failure it is closed instead, so a half-read frame is never mistaken for the next.
"""

import select
import socket
import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from agents.transport.auth import join_peer
from agents.transport.base import parse_address
from agents.transport.errors import (
    AuthenticationError,
    CorruptBlocksError,
    MissingBlocksError,
    RemoteError,
    TransportError,
)

# Errors reported by a whole, well-formed frame: the connection is still usable.
_IN_STEP_ERRORS = (MissingBlocksError, CorruptBlocksError, RemoteError)


@dataclass(frozen=True, slots=True)
class PoolSettings:
    connect_timeout_s: float = 5.0
    io_timeout_s: float = 30.0
    max_idle_per_peer: int = 4
    max_idle_s: float = 60.0


class ConnectionPool:
    def __init__(self, secret: bytes, settings: PoolSettings) -> None:
        self._secret = secret
        self._settings = settings
        self._idle: dict[str, deque[tuple[socket.socket, float]]] = defaultdict(deque)
        self._lock = threading.Lock()
        self._closed = False

    @contextmanager
    def connection(self, peer: str) -> Iterator[socket.socket]:
        """An authenticated connection to `peer` for one exchange."""
        sock = self._take_idle(peer) or self._connect(peer)
        try:
            yield sock
        except _IN_STEP_ERRORS:
            self._give_back(peer, sock)
            raise
        except BaseException:
            sock.close()
            raise
        self._give_back(peer, sock)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle = [sock for queue in self._idle.values() for sock, _ in queue]
            self._idle.clear()
        for sock in idle:
            sock.close()

    def _take_idle(self, peer: str) -> socket.socket | None:
        now_s = time.monotonic()
        while True:
            with self._lock:
                if self._closed:
                    raise TransportError(peer, "the transport is closed")
                queue = self._idle.get(peer)
                if not queue:
                    return None
                sock, since_s = queue.pop()
            if now_s - since_s < self._settings.max_idle_s and _is_alive(sock):
                return sock
            sock.close()

    def _give_back(self, peer: str, sock: socket.socket) -> None:
        with self._lock:
            queue = self._idle[peer]
            if not self._closed and len(queue) < self._settings.max_idle_per_peer:
                queue.append((sock, time.monotonic()))
                return
        sock.close()

    def _connect(self, peer: str) -> socket.socket:
        host, port = parse_address(peer)
        try:
            sock = socket.create_connection((host, port), timeout=self._settings.connect_timeout_s)
        except OSError as exc:
            raise TransportError(peer, f"cannot connect: {exc}") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            join_peer(sock, self._secret, peer)
            sock.settimeout(self._settings.io_timeout_s)
        except (TransportError, OSError) as exc:
            sock.close()
            if isinstance(exc, AuthenticationError):
                raise
            raise TransportError(peer, f"authentication failed: {exc}") from None
        return sock


def _is_alive(sock: socket.socket) -> bool:
    """False if the peer closed an idle connection (or sent something unasked)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable
