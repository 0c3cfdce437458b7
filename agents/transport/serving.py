"""Calling the block source and sink for a peer, and turning their failures into error frames.

The server side maps an exception to an error frame (missing keys, corrupt keys, or the
text of anything else) and keeps the connection; the client side maps the frame back to
the matching exception, naming the peer.
"""

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from agents.transport.base import BlockSink, BlockSource, SourceBatch, check_batch
from agents.transport.errors import (
    CorruptBlocksError,
    MissingBlocksError,
    RemoteError,
    TransportError,
)
from agents.transport.frames import Buffer, Frame, Kind, checksum
from agents.transport.server import ServerConnection

_MAX_DETAIL_BYTES = 4096


@contextmanager
def looked_up(source: BlockSource | None, keys: Sequence[int]) -> Iterator[tuple[SourceBatch, int]]:
    """The source's batch for `keys` and its block size; runs the batch's `release` after."""
    if source is None:
        raise RemoteError(None, "this agent serves no blocks (no block source)")
    found = source(keys)
    batch = found if isinstance(found, SourceBatch) else SourceBatch(found)
    try:
        try:
            size = check_batch(keys, batch.blocks)
            if batch.checksums is not None and len(batch.checksums) != len(keys):
                raise ValueError(f"{len(batch.checksums)} checksums for {len(keys)} blocks")
        except ValueError as exc:
            raise RemoteError(None, f"block source returned a bad batch: {exc}") from None
        yield batch, size
    finally:
        if batch.release is not None:
            batch.release()


def deliver(
    sink: BlockSink | None,
    request_id: int,
    keys: Sequence[int],
    blocks: Sequence[memoryview],
    bad_keys: Sequence[int],
) -> None:
    """Hand verified pushed blocks to the sink; corrupt ones fail the whole push, by key."""
    if sink is None:
        raise RemoteError(None, "this agent accepts no pushed blocks (no block sink)")
    if bad_keys:
        raise CorruptBlocksError(bad_keys)
    sink(request_id, keys, blocks)


def send_error(conn: ServerConnection, exc: Exception) -> None:
    """Report `exc` to the peer as an error frame; the connection stays in step."""
    if isinstance(exc, CorruptBlocksError):
        kind, keys, detail = Kind.ERR_CORRUPT, exc.keys, exc.message
    elif isinstance(exc, KeyError):
        kind, keys, detail = Kind.ERR_MISSING, _missing_keys(exc), str(exc)
    elif isinstance(exc, TransportError):
        kind, keys, detail = Kind.ERR_REMOTE, (), exc.message
    else:
        kind, keys, detail = Kind.ERR_REMOTE, (), f"{type(exc).__name__}: {exc}"
    conn.send(kind, keys, meta=detail.encode(errors="replace")[:_MAX_DETAIL_BYTES])


def raise_for_frame(frame: Frame, peer: str, expected: Kind) -> None:
    """Raise the exception an error frame stands for, or if the reply is not `expected`."""
    if frame.kind == expected:
        return
    detail = frame.meta.decode(errors="replace")
    if frame.kind == Kind.ERR_MISSING:
        raise MissingBlocksError(frame.keys, peer, detail)
    if frame.kind == Kind.ERR_CORRUPT:
        raise CorruptBlocksError(frame.keys, peer)
    if frame.kind == Kind.ERR_REMOTE:
        raise RemoteError(peer, detail)
    raise TransportError(peer, f"replied with a {frame.kind.name} frame, expected {expected.name}")


def failed_checksums(
    keys: Sequence[int], blocks: Sequence[Buffer], checksums: Sequence[int]
) -> tuple[int, ...]:
    """The keys whose block does not hash to its checksum."""
    pairs = zip(keys, blocks, checksums, strict=True)
    return tuple(key for key, block, want in pairs if checksum(block) != want)


def verified(
    peer: str, asked: Sequence[int], answered: Sequence[int], blocks: list[memoryview], bad_keys
) -> list[memoryview]:
    """`blocks` if they answer the keys asked and none failed; else the matching error."""
    if tuple(answered) != tuple(asked):
        raise TransportError(
            peer, f"answered {len(answered)} keys other than the {len(asked)} asked"
        )
    if bad_keys:
        bad = set(bad_keys)
        good = {key: block for key, block in zip(asked, blocks, strict=True) if key not in bad}
        raise CorruptBlocksError(bad_keys, peer, good)
    return blocks


def _missing_keys(exc: KeyError) -> tuple[int, ...]:
    """The keys a KeyError names: our MissingBlocksError, a pool MissingBlock, or KeyError(k)."""
    for candidate in (getattr(exc, "keys", None), getattr(exc, "key", None), *exc.args[:1]):
        if isinstance(candidate, int):
            return (candidate,)
        if isinstance(candidate, tuple | list) and all(isinstance(k, int) for k in candidate):
            return tuple(candidate)
    return ()
