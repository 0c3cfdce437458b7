"""The data-plane benchmark: fetch a batch of KV blocks between two processes on loopback.

The same bytes move three ways in one run, interleaved per repeat, each into the same
preallocated buffer: our TCP transport (a FETCH on an authenticated pooled connection, the
source sending the checksums stored with its blocks as the pool does, the receiver hashing
every block), the baseline of a bare socket (`sendall` of each block, `recv_into`: no
framing, no checksums), and Mooncake's Transfer Engine when it is installed (the same
FETCH on our connection, bytes moved by the engine). `ratio` = ours / socket.
"""

import multiprocessing as mp
import os
import socket
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection

from agents.transport import SourceBatch, checksum, make_transport
from agents.transport.base import format_address
from agents.transport.mooncake_engine import mooncake_missing_reason

_SECRET = b"bench-secret"
_BITS_PER_BYTE = 8
_CLONE_NEWNET = 0x40000000


@dataclass(frozen=True, slots=True)
class TransportBenchResult:
    """Median throughputs in gigabits per second (1e9 bits/s) and median seconds per batch."""

    num_blocks: int
    block_bytes: int
    total_bytes: int
    num_repeats: int
    ours_gbps: float
    socket_gbps: float
    mooncake_gbps: float | None
    ratio: float
    ours_s: float
    socket_s: float
    mooncake_s: float | None
    mooncake_skipped: str | None


def _make_blocks(num_blocks: int, block_bytes: int) -> list[bytes]:
    return [os.urandom(block_bytes) for _ in range(num_blocks)]


def _serve(
    pipe: Connection,
    num_blocks: int,
    block_bytes: int,
    with_mooncake: bool,
    netns: str | None = None,
    address: str = "127.0.0.1",
) -> None:
    """The serving process: one block store behind every transport and a bare socket, on
    `address`, inside the network namespace `netns` when given (another virtual host)."""
    if netns is not None:
        _enter_netns(netns)
    blocks = _make_blocks(num_blocks, block_bytes)
    sums = [checksum(block) for block in blocks]  # stored with the blocks, as the pool does
    pipe.send([b[:16] for b in blocks])  # lets the client check it got these very bytes

    def lookup(keys: Sequence[int]) -> SourceBatch:
        return SourceBatch([blocks[k] for k in keys], [sums[k] for k in keys])

    kinds = ("tcp", "mooncake") if with_mooncake else ("tcp",)
    servers = [make_transport(kind, secret=_SECRET, source=lookup) for kind in kinds]
    addresses = [server.start(f"{address}:0") for server in servers]
    listener = socket.create_server((address, 0))
    pipe.send((addresses, format_address(address, listener.getsockname()[1])))
    sock, _ = listener.accept()
    while sock.recv(1):  # one byte asks for the whole batch; EOF ends the run
        for block in blocks:
            sock.sendall(block)
    sock.close()
    listener.close()
    for server in servers:
        server.close()


def _enter_netns(name: str) -> None:
    """Move this (single-threaded, freshly spawned) process into the named namespace."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    with open(f"/var/run/netns/{name}") as handle:
        if libc.setns(handle.fileno(), _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"cannot enter network namespace {name}")


def _recv_batch(sock: socket.socket, buffer: memoryview) -> None:
    got = 0
    while got < len(buffer):
        got += sock.recv_into(buffer[got:])


def _clear_heads(buffer: memoryview, block_bytes: int) -> None:
    for start in range(0, len(buffer), block_bytes):
        buffer[start : start + 16] = bytes(min(16, block_bytes))


def _check_heads(buffer: memoryview, block_bytes: int, heads: list[bytes], what: str) -> None:
    """Each block's first bytes are the served ones (the transports check every byte)."""
    got = [bytes(buffer[start : start + 16]) for start in range(0, len(buffer), block_bytes)]
    if got != heads:
        raise RuntimeError(f"the {what} delivered other bytes than were served")


def run_transport_bench(
    num_blocks: int = 64,
    block_bytes: int = 1 << 20,
    repeats: int = 5,
    *,
    serve_netns: str | None = None,
    serve_address: str = "127.0.0.1",
) -> TransportBenchResult:
    """Fetch `num_blocks` blocks of `block_bytes` `repeats` times each way; medians. With
    `serve_netns`, the serving process runs in that namespace on `serve_address` and the
    bytes cross its link (backend/bench/netns.py); Mooncake is then left out."""
    if num_blocks <= 0 or block_bytes <= 0 or repeats <= 0:
        raise ValueError("num_blocks, block_bytes and repeats must be positive")
    skipped = mooncake_missing_reason()
    if serve_netns is not None:
        skipped = "not run across network namespaces"
    parent, child = mp.get_context("spawn").Pipe()
    server = mp.get_context("spawn").Process(
        target=_serve,
        args=(child, num_blocks, block_bytes, skipped is None, serve_netns, serve_address),
        daemon=True,
    )
    server.start()
    if not parent.poll(60):
        server.kill()
        raise RuntimeError("the benchmark's serving process did not start")
    heads = parent.recv()
    addresses, socket_address = parent.recv()
    keys = list(range(num_blocks))
    clients = [
        make_transport(kind, secret=_SECRET) for kind in ("tcp", "mooncake")[: len(addresses)]
    ]
    host, port = socket_address.rsplit(":", 1)
    raw = socket.create_connection((host, int(port)))
    buffer = memoryview(bytearray(num_blocks * block_bytes))
    times: list[list[float]] = [[] for _ in range(1 + len(clients))]
    try:
        for repeat in range(repeats + 1):  # the first round warms up connections and caches
            _clear_heads(buffer, block_bytes)
            started = time.perf_counter()
            raw.sendall(b"x")
            _recv_batch(raw, buffer)
            elapsed = [time.perf_counter() - started]
            _check_heads(buffer, block_bytes, heads, "bare socket")
            for client, address in zip(clients, addresses, strict=True):
                _clear_heads(buffer, block_bytes)
                started = time.perf_counter()
                client.fetch(address, keys, out=buffer)
                elapsed.append(time.perf_counter() - started)
                _check_heads(buffer, block_bytes, heads, f"{client.kind} transport")
            if repeat:
                for series, seconds in zip(times, elapsed, strict=True):
                    series.append(seconds)
    finally:
        raw.close()
        for client in clients:
            client.close()
        server.join(timeout=10)
        if server.is_alive():
            server.kill()
    total = num_blocks * block_bytes
    medians = [statistics.median(series) for series in times]
    gbps = [total * _BITS_PER_BYTE / seconds / 1e9 for seconds in medians]
    return TransportBenchResult(
        num_blocks=num_blocks,
        block_bytes=block_bytes,
        total_bytes=total,
        num_repeats=repeats,
        ours_gbps=gbps[1],
        socket_gbps=gbps[0],
        mooncake_gbps=gbps[2] if len(gbps) > 2 else None,
        ratio=gbps[1] / gbps[0],
        ours_s=medians[1],
        socket_s=medians[0],
        mooncake_s=medians[2] if len(medians) > 2 else None,
        mooncake_skipped=skipped,
    )
