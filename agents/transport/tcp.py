"""TcpTransport: the project's own data plane, KV blocks straight over authenticated TCP.

A fetch is one FETCH frame out and one BLOCKS frame back; a push is one PUSH frame out and
an ACK back. Blocks leave from the source's own buffers (sendmsg over memoryviews) and land
in one buffer per batch (recv_into), so each byte is copied only by the kernel.
"""

import logging
from collections.abc import Sequence

from agents.transport.auth import as_secret
from agents.transport.base import BlockSink, BlockSource, Buffer, check_batch, out_view
from agents.transport.client import ConnectionPool, PoolSettings
from agents.transport.frames import Frame, Kind
from agents.transport.server import FrameServer, ServerConnection, ServerSettings
from agents.transport.serving import deliver, looked_up, raise_for_frame, send_error, verified
from agents.transport.wire import read_frame, send_frame

logger = logging.getLogger(__name__)


class TcpTransport:
    """Serves `source` and `sink` on one address and fetches/pushes from/to peers."""

    kind = "tcp"

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
        self._source = source
        self._sink = sink
        self._limits = server_settings.limits
        self._server = FrameServer(self._secret, self, server_settings)
        self._pool = ConnectionPool(self._secret, pool_settings)

    @property
    def address(self) -> str | None:
        return self._server.address

    def start(self, bind_address: str) -> str:
        return self._server.start(bind_address)

    def close(self) -> None:
        self._pool.close()
        self._server.close()

    # -- requester side -------------------------------------------------------------------
    def fetch(self, peer: str, keys: Sequence[int], out: Buffer | None = None) -> list[memoryview]:
        into = out_view(out)
        if not keys:
            return []
        with self._pool.connection(peer) as sock:
            send_frame(sock, Kind.FETCH, keys)
            reply = read_frame(sock, peer, self._limits, out=into)
            raise_for_frame(reply, peer, Kind.BLOCKS)
        return verified(peer, keys, reply.keys, reply.blocks(), reply.bad_keys)

    def push(
        self, peer: str, request_id: int, keys: Sequence[int], blocks: Sequence[Buffer]
    ) -> None:
        size = check_batch(keys, blocks)
        with self._pool.connection(peer) as sock:
            send_frame(
                sock, Kind.PUSH, keys, request_id=request_id, block_bytes=size, blocks=blocks
            )
            raise_for_frame(read_frame(sock, peer, self._limits), peer, Kind.ACK)

    # -- serving side (FrameHandler) ------------------------------------------------------
    def on_frame(self, conn: ServerConnection, frame: Frame) -> None:
        try:
            if frame.kind == Kind.FETCH:
                with looked_up(self._source, frame.keys) as (batch, size):
                    conn.send(
                        Kind.BLOCKS,
                        frame.keys,
                        block_bytes=size,
                        blocks=batch.blocks,
                        checksums=batch.checksums,
                    )
            elif frame.kind == Kind.PUSH:
                blocks = frame.blocks()
                deliver(self._sink, frame.request_id, frame.keys, blocks, frame.bad_keys)
                conn.send(Kind.ACK, request_id=frame.request_id)
            else:
                conn.send(Kind.ERR_REMOTE, meta=f"unexpected {frame.kind.name} frame".encode())
        except (OSError, TimeoutError):
            raise  # the link failed mid-reply: the server drops this connection
        except Exception as exc:
            logger.info("data plane: %s frame from %s failed: %s", frame.kind.name, conn.peer, exc)
            send_error(conn, exc)

    def on_close(self, conn: ServerConnection) -> None:
        pass
