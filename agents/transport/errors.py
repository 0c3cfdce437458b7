"""The data plane's errors: each names the peer and what went wrong, and carries block keys.

A requester reacts by kind: `MissingBlocksError` and `CorruptBlocksError` name the keys to
recompute (the connection stays usable); any other `TransportError` means the peer or the
link failed and the whole batch must be fetched elsewhere or recomputed.
"""

from collections.abc import Iterable, Mapping


def _names(keys: Iterable[int]) -> str:
    shown = [f"{key:#x}" for key in keys]
    return ", ".join(shown[:8]) + (f" and {len(shown) - 8} more" if len(shown) > 8 else "")


class TransportError(Exception):
    """A transfer with `peer` ("host:port", or None before a peer is known) failed."""

    def __init__(self, peer: str | None, message: str) -> None:
        super().__init__(f"peer {peer}: {message}" if peer else message)
        self.peer = peer
        self.message = message


class PeerClosedError(TransportError):
    """The peer closed the connection cleanly, between frames."""


class AuthenticationError(TransportError):
    """The peer did not prove it holds the shared secret, or refused ours."""


class FrameTooLargeError(TransportError):
    """A header announced more bytes than the configured limits allow; nothing was allocated."""


class RemoteError(TransportError):
    """The peer's block source or sink raised; the message is the peer's account of it."""


class MissingBlocksError(TransportError, KeyError):
    """Blocks the serving shard does not hold; a block source raises it for missing keys."""

    def __init__(self, keys: Iterable[int], peer: str | None = None, detail: str = "") -> None:
        self.keys = tuple(keys)
        message = f"does not hold block(s) {_names(self.keys)}"
        super().__init__(peer, f"{message} ({detail})" if detail else message)

    def __str__(self) -> str:  # KeyError would print repr(args)
        return self.args[0]


class CorruptBlocksError(TransportError):
    """Blocks whose bytes failed their xxh3_64 checksum after transfer: recompute `keys`.

    `good` holds the blocks of the same batch that did verify, by key, so a requester can
    keep them and recompute only the corrupt ones.
    """

    def __init__(
        self,
        keys: Iterable[int],
        peer: str | None = None,
        good: Mapping[int, memoryview] | None = None,
    ) -> None:
        self.keys = tuple(keys)
        self.good = dict(good or {})
        super().__init__(peer, f"checksum failed for block(s) {_names(self.keys)}")
