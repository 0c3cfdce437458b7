"""MooncakeTransport: the data plane with Mooncake's Transfer Engine moving the block bytes.

The Transfer Engine only reads and writes registered memory; it has no request/reply and
does not authenticate. So requests travel on our authenticated frame connection and the
bytes through the engine: a FETCH is answered with a LEASE (the blocks copied into one
registered staging buffer, its address and the blocks' checksums), the requester reads
that buffer with the engine and sends RELEASE; a push asks with PUSH_BEGIN for a LEASE of a
registered receive buffer, writes it with the engine and sends PUSH_COMMIT, upon which the
server checks every checksum and hands the blocks to its sink. Leases are per connection
and dropped when it closes.
"""

import itertools
import json
import threading
from collections.abc import Sequence

import numpy as np

from agents.transport.auth import as_secret
from agents.transport.base import (
    BlockSink,
    BlockSource,
    Buffer,
    check_batch,
    out_view,
    parse_address,
)
from agents.transport.client import ConnectionPool, PoolSettings
from agents.transport.errors import RemoteError, TransportError
from agents.transport.frames import Frame, Kind, checksum
from agents.transport.mooncake_engine import MooncakeEngine, mooncake_missing_reason
from agents.transport.server import FrameServer, ServerConnection, ServerSettings
from agents.transport.serving import (
    deliver,
    failed_checksums,
    looked_up,
    raise_for_frame,
    send_error,
    verified,
)
from agents.transport.staging import StagingBuffers, landing, split, stage
from agents.transport.wire import read_frame, send_frame

_MAX_LEASES_PER_CONNECTION = 8


class MooncakeTransport:
    """The Transport interface over Mooncake's Transfer Engine (TCP, P2P handshake)."""

    kind = "mooncake"

    def __init__(
        self,
        *,
        secret: bytes | str,
        source: BlockSource | None = None,
        sink: BlockSink | None = None,
        server_settings: ServerSettings = ServerSettings(),
        pool_settings: PoolSettings = PoolSettings(),
    ) -> None:
        self._secret = as_secret(secret)
        if reason := mooncake_missing_reason():
            raise TransportError(None, reason)
        self._source, self._sink = source, sink
        self._limits = server_settings.limits
        self._timeout_s = pool_settings.io_timeout_s
        self._server = FrameServer(self._secret, self, server_settings)
        self._pool = ConnectionPool(self._secret, pool_settings)
        self._engine: MooncakeEngine | None = None
        self._lock = threading.Lock()
        self._lease_ids = itertools.count(1)
        self._abandoned: list[np.ndarray] = []  # buffers of leases whose connection died
        self._staging = StagingBuffers()

    @property
    def address(self) -> str | None:
        return self._server.address

    def start(self, bind_address: str) -> str:
        self._engine_on(parse_address(bind_address)[0])
        return self._server.start(bind_address)

    def close(self) -> None:
        self._pool.close()
        self._server.close()
        with self._lock:
            engine, self._engine = self._engine, None
        del engine  # tears the engine down now (about a second), closing its ports

    def _engine_on(self, host: str = "127.0.0.1") -> MooncakeEngine:
        with self._lock:
            if self._engine is None:
                self._engine = MooncakeEngine(host)
            return self._engine

    # -- requester side -------------------------------------------------------------------
    def fetch(self, peer: str, keys: Sequence[int], out: Buffer | None = None) -> list[memoryview]:
        into = out_view(out)
        if not keys:
            return []
        with self._pool.connection(peer) as sock:
            send_frame(sock, Kind.FETCH, keys)
            lease = read_frame(sock, peer, self._limits)
            raise_for_frame(lease, peer, Kind.LEASE)
            session, remote_address = _where(lease, peer)
            engine = self._engine_on()
            local = landing(into, len(lease.keys) * lease.block_bytes, peer)
            engine.register(local)
            try:
                engine.transfer(True, peer, session, local, remote_address, self._timeout_s)
            finally:
                engine.unregister(local)
            send_frame(sock, Kind.RELEASE, request_id=lease.request_id)
        blocks = split(local, len(lease.keys))
        bad = failed_checksums(lease.keys, blocks, lease.checksums)
        return verified(peer, keys, lease.keys, blocks, bad)

    def push(
        self, peer: str, request_id: int, keys: Sequence[int], blocks: Sequence[Buffer]
    ) -> None:
        size = check_batch(keys, blocks)
        local = stage(blocks, size, self._staging)
        sums = [checksum(block) for block in split(local, len(keys))]
        with self._pool.connection(peer) as sock:
            send_frame(
                sock, Kind.PUSH_BEGIN, keys, request_id=request_id, block_bytes=size, checksums=sums
            )
            lease = read_frame(sock, peer, self._limits)
            raise_for_frame(lease, peer, Kind.LEASE)
            session, remote_address = _where(lease, peer)
            engine = self._engine_on()
            engine.register(local)
            try:
                engine.transfer(False, peer, session, local, remote_address, self._timeout_s)
            finally:
                engine.unregister(local)
            self._staging.give_back(local)
            send_frame(sock, Kind.PUSH_COMMIT, request_id=lease.request_id)
            raise_for_frame(read_frame(sock, peer, self._limits), peer, Kind.ACK)

    # -- serving side (FrameHandler) ------------------------------------------------------
    def on_frame(self, conn: ServerConnection, frame: Frame) -> None:
        leases: dict[int, tuple] = conn.state.setdefault("leases", {})
        try:
            if frame.kind == Kind.FETCH:
                with looked_up(self._source, frame.keys) as (batch, size):
                    staging = stage(batch.blocks, size, self._staging)
                    sums = batch.checksums
                if sums is None:
                    sums = [checksum(block) for block in split(staging, len(frame.keys))]
                self._lease(conn, leases, staging, frame, size, sums)
            elif frame.kind == Kind.RELEASE:
                lease = leases.pop(frame.request_id, None)
                self._drop(lease)
                if lease is not None and lease[1].kind == Kind.FETCH:  # no view of it is out
                    self._staging.give_back(lease[0])
            elif frame.kind == Kind.PUSH_BEGIN:
                if self._sink is None:
                    raise RemoteError(None, "this agent accepts no pushed blocks (no block sink)")
                if not frame.keys or frame.block_bytes <= 0:
                    raise RemoteError(None, "PUSH_BEGIN announces no blocks")
                staging = np.empty(len(frame.keys) * frame.block_bytes, dtype=np.uint8)
                self._lease(conn, leases, staging, frame, frame.block_bytes, frame.checksums)
            elif frame.kind == Kind.PUSH_COMMIT:
                self._commit(conn, leases.pop(frame.request_id, None))
            else:
                raise RemoteError(None, f"unexpected {frame.kind.name} frame")
        except (OSError, TimeoutError):
            raise
        except Exception as exc:
            send_error(conn, exc)

    def on_close(self, conn: ServerConnection) -> None:
        for lease in conn.state.get("leases", {}).values():
            self._drop(lease)
            self._abandoned.append(lease[0])  # a transfer may still touch it; never free

    def _lease(self, conn, leases, staging, frame: Frame, size: int, sums) -> None:
        if len(leases) >= _MAX_LEASES_PER_CONNECTION:
            raise RemoteError(None, f"more than {_MAX_LEASES_PER_CONNECTION} open leases")
        engine = self._engine_on()
        address = engine.register(staging)
        lease_id = next(self._lease_ids)
        leases[lease_id] = (staging, frame)
        meta = json.dumps({"session": engine.session, "address": address}).encode()
        conn.send(
            Kind.LEASE, frame.keys, request_id=lease_id, block_bytes=size, meta=meta, checksums=sums
        )

    def _drop(self, lease: tuple | None) -> None:
        if lease is not None and self._engine is not None:
            self._engine.unregister(lease[0])

    def _commit(self, conn: ServerConnection, lease: tuple | None) -> None:
        if lease is None:
            raise RemoteError(None, "PUSH_COMMIT names no open lease")
        self._drop(lease)
        staging, begin = lease
        blocks = split(staging, len(begin.keys))
        bad = failed_checksums(begin.keys, blocks, begin.checksums)
        deliver(self._sink, begin.request_id, begin.keys, blocks, bad)
        conn.send(Kind.ACK, request_id=begin.request_id)


def _where(lease: Frame, peer: str) -> tuple[str, int]:
    """The engine session and buffer address a LEASE frame points at."""
    try:
        meta = json.loads(lease.meta)
        session, address = str(meta["session"]), int(meta["address"])
        parse_address(session)
    except (ValueError, KeyError, TypeError):
        raise TransportError(peer, f"sent a malformed lease {lease.meta[:200]!r}") from None
    if lease.block_bytes <= 0:
        raise TransportError(peer, "sent a lease of empty blocks")
    return session, address
