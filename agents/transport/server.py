"""FrameServer: the listening side of the data plane, one authenticated thread per peer.

It binds exactly the configured address, authenticates every connection before reading a
single frame, and hands whole frames to a handler. A peer that fails authentication, sends
a truncated or oversized frame, or stalls loses its own connection (logged with its
address); every other connection keeps being served.
"""

import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from agents.transport.auth import accept_peer
from agents.transport.base import format_address, parse_address
from agents.transport.errors import PeerClosedError, TransportError
from agents.transport.frames import Frame, FrameLimits
from agents.transport.wire import read_frame, send_frame

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class ServerConnection:
    """One authenticated peer connection; `state` is the handler's per-connection scratch."""

    sock: socket.socket
    peer: str
    state: dict[str, Any] = field(default_factory=dict)

    def send(self, *args: Any, **kwargs: Any) -> list[int]:
        return send_frame(self.sock, *args, **kwargs)


class FrameHandler(Protocol):
    def on_frame(self, conn: ServerConnection, frame: Frame) -> None: ...

    def on_close(self, conn: ServerConnection) -> None: ...


@dataclass(frozen=True, slots=True)
class ServerSettings:
    limits: FrameLimits = field(default_factory=FrameLimits)
    handshake_timeout_s: float = 5.0
    io_timeout_s: float = 30.0
    idle_timeout_s: float = 600.0
    max_connections: int = 256


class FrameServer:
    """Accepts peers on one address and feeds their frames to `handler`."""

    def __init__(self, secret: bytes, handler: FrameHandler, settings: ServerSettings) -> None:
        self._secret = secret
        self._handler = handler
        self._settings = settings
        self._listener: socket.socket | None = None
        self._conns: set[ServerConnection] = set()
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.address: str | None = None

    def start(self, bind_address: str) -> str:
        host, port = parse_address(bind_address)
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICSERV
        )[0]
        listener = socket.socket(family, kind, proto)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(sockaddr)
        listener.listen(128)
        self._listener = listener
        self.address = format_address(host, listener.getsockname()[1])
        self._spawn(self._accept_loop, f"transport-accept-{self.address}")
        return self.address

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, threads = list(self._conns), list(self._threads)
        if self._listener is not None:
            _shutdown(self._listener)
            self._listener.close()
        for conn in conns:
            _shutdown(conn.sock)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout=5.0)

    def _spawn(self, target: Callable[..., None], name: str, *args: Any) -> None:
        thread = threading.Thread(target=self._run, args=(target, *args), name=name, daemon=True)
        with self._lock:
            self._threads.add(thread)
        thread.start()

    def _run(self, target: Callable[..., None], *args: Any) -> None:
        try:
            target(*args)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while True:
            try:
                sock, sockaddr = self._listener.accept()
            except OSError:
                return  # the listener was shut down by close()
            peer = format_address(sockaddr[0], sockaddr[1])
            with self._lock:
                refuse = self._closed or len(self._conns) >= self._settings.max_connections
                conn = ServerConnection(sock, peer)
                if not refuse:
                    self._conns.add(conn)
            if refuse:
                logger.warning("data plane: refusing %s, at %d connections", peer, len(self._conns))
                sock.close()
                continue
            self._spawn(self._serve, f"transport-peer-{peer}", conn)

    def _serve(self, conn: ServerConnection) -> None:
        settings, sock = self._settings, conn.sock
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(settings.handshake_timeout_s)
            accept_peer(sock, self._secret, conn.peer)
            while True:
                sock.settimeout(settings.idle_timeout_s)
                frame = read_frame(sock, conn.peer, settings.limits, settings.io_timeout_s)
                sock.settimeout(settings.io_timeout_s)
                self._handler.on_frame(conn, frame)
        except PeerClosedError:
            pass
        except (TransportError, OSError) as exc:
            if not self._closed:
                logger.warning("data plane: dropping connection of %s: %s", conn.peer, exc)
        except Exception:
            logger.exception("data plane: handler failed on a frame of %s", conn.peer)
        finally:
            self._handler.on_close(conn)
            with self._lock:
                self._conns.discard(conn)
            sock.close()


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
