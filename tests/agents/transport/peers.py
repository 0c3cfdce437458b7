"""Peer processes for the transport tests: an honest block server and a truncating one.

They run in processes of the spawn context, so they are plain module-level functions that
talk to the test through a Pipe: first the address they listen on, then answers to
("pushes",) until ("stop",).
"""

import os
import random
import socket
from collections.abc import Sequence
from multiprocessing.connection import Connection

from agents.transport import SourceBatch, checksum, make_transport
from agents.transport.frames import HEADER, MAGIC, Frame, Kind, pack_u64s
from agents.transport.server import FrameServer, ServerConnection, ServerSettings
from agents.transport.wire import send_buffers

SECRET = b"test-secret-of-the-data-plane"
NUM_BLOCKS = 16
BLOCK_BYTES = 64 << 10
CORRUPT_KEY = 0xBAD  # served with bytes that no longer match its stored checksum
KEYS = [0x1000 + i * 0x9E3779B1 for i in range(NUM_BLOCKS)]


def make_blocks(seed: int = 7) -> dict[int, bytes]:
    """The server's blocks, the same in every process for one seed."""
    rng = random.Random(seed)
    return {key: rng.randbytes(BLOCK_BYTES) for key in [*KEYS, CORRUPT_KEY]}


def serve_blocks(pipe: Connection, kind: str, bind_address: str = "127.0.0.1:0") -> None:
    """An honest agent: serves make_blocks() and records what is pushed to it."""
    blocks = make_blocks()
    sums = {key: checksum(block) for key, block in blocks.items()}
    flipped = bytearray(blocks[CORRUPT_KEY])
    flipped[BLOCK_BYTES // 2] ^= 0x40  # one bit rots after the checksum was stored
    blocks[CORRUPT_KEY] = bytes(flipped)
    pushes: list[tuple[int, tuple[int, ...], list[int]]] = []

    def lookup(keys: Sequence[int]) -> SourceBatch:
        return SourceBatch([blocks[k] for k in keys], [sums[k] for k in keys])  # KeyError

    def sink(request_id: int, keys: Sequence[int], got: Sequence[memoryview]) -> None:
        pushes.append((request_id, tuple(keys), [checksum(block) for block in got]))

    transport = make_transport(kind, secret=SECRET, source=lookup, sink=sink)
    pipe.send(transport.start(bind_address))
    while (request := pipe.recv()) != ("stop",):
        if request == ("pushes",):
            pipe.send(list(pushes))
    transport.close()


class _TruncatingHandler:
    """Answers every frame with a batch header promising more bytes than it then sends."""

    def on_frame(self, conn: ServerConnection, frame: Frame) -> None:
        num = len(frame.keys)
        header = HEADER.pack(MAGIC, Kind.BLOCKS, num, 0, BLOCK_BYTES, 0)
        half = bytes(num * BLOCK_BYTES // 2)
        send_buffers(conn.sock, [header, pack_u64s(frame.keys), half])
        conn.sock.shutdown(socket.SHUT_RDWR)

    def on_close(self, conn: ServerConnection) -> None:
        pass


def serve_truncated(pipe: Connection) -> None:
    """A peer that authenticates properly, then breaks off every batch halfway."""
    server = FrameServer(SECRET, _TruncatingHandler(), ServerSettings())
    pipe.send(server.start("127.0.0.1:0"))
    pipe.recv()
    server.close()


def listening_addresses(pipe: Connection, kind: str) -> None:
    """Start a transport and report every address this process listens on (from /proc)."""
    transport = make_transport(kind, secret=SECRET)
    transport.start("127.0.0.1:0")
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    address_hex, port_hex = fields[1].split(":")
                    found.append((_ip(address_hex, width), int(port_hex, 16)))
    pipe.send((transport.address, found))
    pipe.recv()
    transport.close()


def _ip(address_hex: str, width: int) -> str:
    raw = bytes.fromhex(address_hex)
    if width == 8:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))  # per-word little-endian
    return socket.inet_ntop(socket.AF_INET6, words)
