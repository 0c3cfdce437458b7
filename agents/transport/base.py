"""The transport interface every data-plane implementation offers, and its callbacks' shapes.

An agent starts one transport bound to its configured address; the pool shard plugs in as
the block source (serving `fetch`) and the receiving side of `push` as the sink. Peers are
named by the address their transport's `start` returned ("host:port", IPv6 as "[::1]:port").
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from agents.transport.frames import Buffer


@dataclass(frozen=True, slots=True)
class SourceBatch:
    """What a block source may return instead of a plain list of blocks.

    `checksums` are the blocks' stored xxh3_64 sums (the pool keeps one per block): sent as
    they are, they spare hashing on the way out and let the receiver check the blocks end
    to end. `release` runs once the blocks have been sent (or the send failed): pin the
    blocks in the source, unpin them there.
    """

    blocks: Sequence[Buffer]
    checksums: Sequence[int] | None = None
    release: Callable[[], None] | None = None


BlockSource = Callable[[Sequence[int]], "Sequence[Buffer] | SourceBatch"]
"""`lookup(keys)`: the blocks' bytes in key order, all of one size, or a SourceBatch.

Raise `MissingBlocksError(keys)` (or any KeyError naming the key, like the pool's
MissingBlock) for blocks not held; the requester gets an error frame naming them. The
buffers must stay valid until they are sent.
"""

BlockSink = Callable[[int, Sequence[int], Sequence[memoryview]], None]
"""`sink(request_id, keys, blocks)`: takes pushed blocks, already checked against their
checksums. The views are the sink's to keep; an exception goes back to the pusher."""


class Transport(Protocol):
    """Moves batches of fixed-size KV blocks between agents, authenticated by a shared secret."""

    kind: str

    @property
    def address(self) -> str | None:
        """The address `start` bound (what peers pass to fetch/push), None before it."""
        ...

    def start(self, bind_address: str) -> str:
        """Listen on exactly `bind_address` ("host:port", port 0 picks one); returns it."""
        ...

    def fetch(self, peer: str, keys: Sequence[int], out: Buffer | None = None) -> list[memoryview]:
        """The blocks of `keys` from `peer`, verified, in key order.

        With `out` (a writable buffer of at least len(keys) x block bytes, e.g. free pool
        slots or a KV tensor) the blocks land there and the views point into it; otherwise
        into a buffer allocated for this batch.
        """
        ...

    def push(
        self, peer: str, request_id: int, keys: Sequence[int], blocks: Sequence[Buffer]
    ) -> None:
        """Hand `blocks` to `peer`'s sink for `request_id`; returns once the sink took them."""
        ...

    def close(self) -> None:
        """Stop serving and drop pooled connections; idempotent."""
        ...


def parse_address(address: str) -> tuple[str, int]:
    """("host", port) from "host:port" or "[v6]:port"; ValueError with the address if bad."""
    host, sep, port_text = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"expected a 'host:port' address, got {address!r}")
    return host, int(port_text)


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def out_view(out: Buffer | None) -> memoryview | None:
    """`out` as a writable flat byte view; ValueError before anything is sent if it is not."""
    if out is None:
        return None
    view = memoryview(out)
    if view.readonly or not view.c_contiguous:
        raise ValueError("out must be a writable, contiguous buffer")
    return view.cast("B")


def check_batch(keys: Sequence[int], blocks: Sequence[Buffer]) -> int:
    """The common block size of a batch to send; ValueError if the batch is malformed."""
    if len(keys) != len(blocks):
        raise ValueError(f"{len(keys)} keys but {len(blocks)} blocks")
    views = [memoryview(block) for block in blocks]
    if not all(view.c_contiguous for view in views):
        raise ValueError("blocks must be contiguous buffers")
    sizes = {view.nbytes for view in views}
    if len(sizes) > 1:
        raise ValueError(f"blocks of one batch must share one size, got sizes {sorted(sizes)}")
    size = sizes.pop() if sizes else 0
    if keys and size == 0:
        raise ValueError("blocks must not be empty")
    return size
