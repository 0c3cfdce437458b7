"""Moving frames over a socket with as few copies as the kernel allows.

Blocks leave straight from the caller's buffers (sendmsg over memoryviews for runs of
small ones, sendall for each large one; never joined) and land with `recv_into` in one
buffer per frame, the caller's own or one allocated once the header passed the limits.
Each block is hashed right after it lands, while it is still in the CPU cache.
"""

import socket
import struct
from collections.abc import Sequence

import numpy as np

from agents.transport.errors import PeerClosedError, TransportError
from agents.transport.frames import (
    CHECKSUM_KINDS,
    HEADER,
    MAGIC,
    PAYLOAD_KINDS,
    Buffer,
    Frame,
    FrameLimits,
    Kind,
    check_limits,
    checksum,
    pack_u64s,
)

_IOV_MAX = 1024  # Linux's limit on buffers per sendmsg
_LARGE_BUFFER_BYTES = 64 << 10
_SEND_GROUP_BYTES = 1 << 20  # hash this much, then send it while it is still in the cache
_HASH_STEP_BYTES = 1 << 20  # receive this much, then hash it while it is in the cache


def send_buffers(sock: socket.socket, buffers: Sequence[Buffer]) -> None:
    """Send every buffer in order without joining them: runs of small buffers go out in one
    sendmsg, each large one with sendall (measured faster than one sendmsg over many)."""
    small: list[memoryview] = []
    for buffer in buffers:
        view = memoryview(buffer).cast("B")
        if len(view) >= _LARGE_BUFFER_BYTES:
            _send_vectored(sock, small)
            small = []
            sock.sendall(view)
        elif len(view):
            small.append(view)
    _send_vectored(sock, small)


def _send_vectored(sock: socket.socket, views: list[memoryview]) -> None:
    """sendmsg the views, resuming partial sends by slicing (no copy)."""
    while views:
        sent = sock.sendmsg(views[:_IOV_MAX])
        while sent:
            if sent >= len(views[0]):
                sent -= len(views.pop(0))
            else:
                views[0] = views[0][sent:]
                sent = 0


def send_frame(
    sock: socket.socket,
    kind: Kind,
    keys: Sequence[int] = (),
    *,
    request_id: int = 0,
    block_bytes: int = 0,
    meta: bytes = b"",
    blocks: Sequence[Buffer] = (),
    checksums: Sequence[int] | None = None,
) -> list[int]:
    """Send one frame; returns the checksums sent (computed here unless given)."""
    header = HEADER.pack(MAGIC, kind, len(keys), len(meta), block_bytes, request_id)
    group: list[Buffer] = [header, pack_u64s(keys), meta]
    sums = list(checksums) if checksums is not None else []
    group_bytes = 0
    for block in blocks if kind in PAYLOAD_KINDS else ():
        if checksums is None:
            sums.append(checksum(block))
        group.append(block)
        group_bytes += memoryview(block).nbytes
        if group_bytes >= _SEND_GROUP_BYTES:
            send_buffers(sock, group)
            group, group_bytes = [], 0
    if kind in CHECKSUM_KINDS:
        group.append(pack_u64s(sums))
    send_buffers(sock, group)
    return sums


def recv_exact_into(
    sock: socket.socket, view: memoryview, peer: str, what: str, at_boundary: bool = False
) -> None:
    """Fill `view` from the socket or raise a TransportError saying how much was missing.

    At a frame boundary a close before the first byte is a clean close (PeerClosedError).
    """
    got = 0
    while got < len(view):
        try:
            n = sock.recv_into(view[got:])
        except TimeoutError:
            raise TransportError(
                peer, f"timed out after {got} of {len(view)} bytes of {what}"
            ) from None
        if n == 0 and got == 0 and at_boundary:
            raise PeerClosedError(peer, f"closed the connection before sending {what}")
        if n == 0:
            raise TransportError(
                peer, f"connection closed after {got} of {len(view)} bytes of {what}"
            )
        got += n


def recv_exact(
    sock: socket.socket, num_bytes: int, peer: str, what: str, at_boundary: bool = False
) -> bytes:
    buffer = bytearray(num_bytes)
    recv_exact_into(sock, memoryview(buffer), peer, what, at_boundary)
    return bytes(buffer)


def read_header(sock: socket.socket, peer: str, limits: FrameLimits) -> tuple:
    raw = recv_exact(sock, HEADER.size, peer, "a frame header", at_boundary=True)
    magic, kind_value, num, meta, size, request_id = HEADER.unpack(raw)
    if magic != MAGIC:
        raise TransportError(peer, f"bad frame magic {magic!r} (not our peer, or out of step)")
    try:
        kind = Kind(kind_value)
    except ValueError:
        raise TransportError(peer, f"unknown frame kind {kind_value}") from None
    check_limits(kind, num, meta, size, limits, peer)
    return kind, num, meta, size, request_id


def read_frame(
    sock: socket.socket,
    peer: str,
    limits: FrameLimits,
    io_timeout_s: float | None = None,
    out: memoryview | None = None,
) -> Frame:
    """Receive one whole frame, checking each payload block against its trailing checksum.

    The payload lands in `out` (a flat writable view) if given, else in a fresh buffer.
    The socket's own timeout applies to the wait for the header, `io_timeout_s` (if given)
    to each wait for the rest of the frame.
    """
    kind, num, meta_bytes, size, request_id = read_header(sock, peer, limits)
    if io_timeout_s is not None:
        sock.settimeout(io_timeout_s)
    keys = struct.unpack(f"<{num}Q", recv_exact(sock, 8 * num, peer, f"{kind.name} keys"))
    meta = recv_exact(sock, meta_bytes, peer, f"{kind.name} meta")
    payload, computed = None, []
    if kind in PAYLOAD_KINDS:
        if out is not None and len(out) < num * size:
            raise TransportError(
                peer, f"sent {num} blocks of {size} bytes, more than the {len(out)} bytes of out"
            )
        # np.empty, not bytearray: no zero-filling pass over memory recv_into overwrites.
        payload = out[: num * size] if out is not None else memoryview(np.empty(num * size, "u1"))
        computed = _recv_payload(sock, payload, size, keys, peer, kind)
    sums: tuple[int, ...] = ()
    if kind in CHECKSUM_KINDS:
        raw = recv_exact(sock, 8 * num, peer, f"{kind.name} checksums")
        sums = struct.unpack(f"<{num}Q", raw)
    bad = tuple(k for k, want, got in zip(keys, sums, computed, strict=False) if want != got)
    return Frame(kind, request_id, keys, size, meta, payload, sums, bad)


def _recv_payload(sock, payload: memoryview, size: int, keys, peer: str, kind: Kind) -> list[int]:
    """recv_into the payload, hashing every block as soon as it has fully arrived.

    Each recv stops at the end of a step of whole blocks (about 1 MiB) so the step is
    hashed while it is still in the CPU cache: hashing then costs a fifth of a cold pass.
    """
    got, sums = 0, []
    step = size * max(1, _HASH_STEP_BYTES // size)
    while got < len(payload):
        end = min(len(payload), (got // step + 1) * step)
        try:
            n = sock.recv_into(payload[got:end])
        except TimeoutError:
            n = -1
        if n <= 0:
            whole = got // size
            raise TransportError(
                peer,
                f"{'timed out' if n else 'connection closed'} after {got} of "
                f"{len(payload)} payload bytes of a {kind.name} batch of {len(keys)} blocks: "
                f"{len(payload) - got} bytes missing, incomplete from block {keys[whole]:#x} on",
            )
        got += n
        while size and (len(sums) + 1) * size <= got:
            sums.append(checksum(payload[len(sums) * size : (len(sums) + 1) * size]))
    return sums
