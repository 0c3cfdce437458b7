"""The KV data plane ("messenger"): one Transport interface, our TCP or Mooncake behind it.

`make_transport(kind, secret=...)` builds the implementation a setting names; both move
batches of fixed-size blocks by key, authenticate peers with the shared secret, verify
every block's xxh3_64 checksum after transfer and report failures by peer and key.
"""

from agents.transport.base import BlockSink, BlockSource, SourceBatch, Transport, parse_address
from agents.transport.client import PoolSettings
from agents.transport.errors import (
    AuthenticationError,
    CorruptBlocksError,
    FrameTooLargeError,
    MissingBlocksError,
    PeerClosedError,
    RemoteError,
    TransportError,
)
from agents.transport.frames import FrameLimits, checksum
from agents.transport.server import ServerSettings

TRANSPORT_KINDS = ("tcp", "mooncake")


def make_transport(
    kind: str,
    *,
    secret: bytes | str,
    source: BlockSource | None = None,
    sink: BlockSink | None = None,
    server_settings: ServerSettings = ServerSettings(),
    pool_settings: PoolSettings = PoolSettings(),
) -> Transport:
    """A transport of `kind` ("tcp" or "mooncake"); call `start(bind_address)` to serve."""
    if kind == "tcp":
        from agents.transport.tcp import TcpTransport

        return TcpTransport(
            secret=secret,
            source=source,
            sink=sink,
            server_settings=server_settings,
            pool_settings=pool_settings,
        )
    if kind == "mooncake":
        from agents.transport.mooncake import MooncakeTransport

        return MooncakeTransport(
            secret=secret,
            source=source,
            sink=sink,
            server_settings=server_settings,
            pool_settings=pool_settings,
        )
    raise ValueError(f"unknown transport kind {kind!r}; expected one of {TRANSPORT_KINDS}")


__all__ = [
    "TRANSPORT_KINDS",
    "AuthenticationError",
    "BlockSink",
    "BlockSource",
    "CorruptBlocksError",
    "FrameLimits",
    "FrameTooLargeError",
    "MissingBlocksError",
    "PeerClosedError",
    "PoolSettings",
    "RemoteError",
    "ServerSettings",
    "SourceBatch",
    "Transport",
    "TransportError",
    "checksum",
    "make_transport",
    "parse_address",
]
