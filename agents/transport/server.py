"""FrameServer: the listening side of the data plane, one authenticated thread per peer.

It binds exactly the configured address, authenticates every connection before reading a
single frame, and hands whole frames to a handler. A peer that fails authentication, sends
a truncated or oversized frame, or stalls loses its own connection (logged with its
address); every other connection keeps being served.

Connections that have not authenticated yet have slots of their own, few per host and a
short window to prove the secret in, so a flood of connections that never authenticate
cannot take the slots of the peers that do. Refusals are logged at most once per
`LOG_EVERY_S` per kind, with a count of those left unlogged.
"""

import contextlib
import logging
import socket
import threading
import time
from collections import Counter
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


LOG_EVERY_S = 10.0


@dataclass(frozen=True, slots=True)
class ServerSettings:
    limits: FrameLimits = field(default_factory=FrameLimits)
    # A peer proves the secret in one round trip; two seconds leave room for a loaded host.
    handshake_timeout_s: float = 2.0
    io_timeout_s: float = 30.0
    idle_timeout_s: float = 600.0
    max_connections: int = 256  # authenticated ones
    max_handshaking: int = 32  # connections not authenticated yet, all hosts together
    max_handshaking_per_host: int = 8  # ... from one host


class RateLimitedLog:
    """A warning at most once per `every_s` per kind; the next one says how many were left
    unlogged meanwhile. Thread safe."""

    def __init__(self, every_s: float = LOG_EVERY_S) -> None:
        self.every_s = every_s
        self._last_s: dict[str, float] = {}
        self._unlogged: Counter[str] = Counter()
        self._lock = threading.Lock()

    def warning(self, kind: str, message: str, *args: object) -> None:
        now_s = time.monotonic()
        with self._lock:
            if now_s - self._last_s.get(kind, -self.every_s) < self.every_s:
                self._unlogged[kind] += 1
                return
            self._last_s[kind] = now_s
            unlogged = self._unlogged.pop(kind, 0)
        if unlogged:
            message += f" (and {unlogged} more like it in the last {self.every_s:g} s)"
        logger.warning(message, *args)


class FrameServer:
    """Accepts peers on one address and feeds their frames to `handler`."""

    def __init__(self, secret: bytes, handler: FrameHandler, settings: ServerSettings) -> None:
        self._secret = secret
        self._handler = handler
        self._settings = settings
        self._listener: socket.socket | None = None
        self._conns: set[ServerConnection] = set()  # authenticated
        self._handshaking: Counter[str] = Counter()  # host -> connections authenticating
        self._log = RateLimitedLog()
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
            host, peer = sockaddr[0], format_address(sockaddr[0], sockaddr[1])
            with self._lock:
                refusal = self._refusal(host)
                if refusal is None:
                    self._handshaking[host] += 1
            if refusal is not None:
                if not self._closed:
                    self._log.warning(refusal, "data plane: refusing %s: %s", peer, refusal)
                sock.close()
                continue
            self._spawn(self._serve, f"transport-peer-{peer}", ServerConnection(sock, peer), host)

    def _refusal(self, host: str) -> str | None:
        """Why a new connection from `host` is refused now, or None (lock held)."""
        settings = self._settings
        if self._closed:
            return "closing"
        if len(self._conns) >= settings.max_connections:
            return f"at {settings.max_connections} authenticated connections"
        if self._handshaking[host] >= settings.max_handshaking_per_host:
            return f"{settings.max_handshaking_per_host} connections of its host authenticating"
        if self._handshaking.total() >= settings.max_handshaking:
            return f"{settings.max_handshaking} connections authenticating"
        return None

    def _serve(self, conn: ServerConnection, host: str) -> None:
        settings, sock = self._settings, conn.sock
        authenticated = False
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(settings.handshake_timeout_s)
            try:
                accept_peer(sock, self._secret, conn.peer)
            finally:
                with self._lock:
                    self._handshaking[host] -= 1
                    if self._handshaking[host] <= 0:
                        del self._handshaking[host]
            with self._lock:
                authenticated = len(self._conns) < settings.max_connections and not self._closed
                if authenticated:
                    self._conns.add(conn)
            if not authenticated:
                self._log.warning(
                    "full", "data plane: refusing %s: at %d authenticated connections",
                    conn.peer, settings.max_connections,
                )  # fmt: skip
                return
            while True:
                sock.settimeout(settings.idle_timeout_s)
                frame = read_frame(sock, conn.peer, settings.limits, settings.io_timeout_s)
                sock.settimeout(settings.io_timeout_s)
                self._handler.on_frame(conn, frame)
        except PeerClosedError:
            pass
        except (TransportError, OSError) as exc:
            if self._closed:
                pass
            elif authenticated:  # a peer of the cluster: every such drop is worth a line
                logger.warning("data plane: dropping connection of %s: %s", conn.peer, exc)
            else:  # anyone can fail a handshake, as often as they like
                self._log.warning(
                    "handshake", "data plane: refusing %s: %s", conn.peer, exc
                )  # fmt: skip
        except Exception:
            logger.exception("data plane: handler failed on a frame of %s", conn.peer)
        finally:
            if authenticated:
                self._handler.on_close(conn)
            with self._lock:
                self._conns.discard(conn)
            sock.close()


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
