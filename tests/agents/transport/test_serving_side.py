"""The serving side under bad peers, in this process so its log can be read: it drops the
offending connection, names the peer and keeps serving everyone else."""

import logging
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pytest

from agents.transport import FrameLimits, Transport, checksum, make_transport, parse_address
from agents.transport.auth import join_peer
from agents.transport.frames import HEADER, MAGIC, Kind, pack_u64s
from agents.transport.wire import read_frame, send_frame
from tests.agents.transport import peers

BLOCK = peers.BLOCK_BYTES


@dataclass
class Recorder:
    """What the in-process agent's source and sink saw."""

    blocks: dict[int, bytes] = field(default_factory=peers.make_blocks)
    lookup_threads: list[str] = field(default_factory=list)
    pushes: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)

    def lookup(self, keys: Sequence[int]) -> list[bytes]:
        self.lookup_threads.append(threading.current_thread().name)
        return [self.blocks[key] for key in keys]

    def sink(self, request_id: int, keys: Sequence[int], _: Sequence[memoryview]) -> None:
        self.pushes.append((request_id, tuple(keys)))


@pytest.fixture(scope="module")
def agent(kind: str) -> Iterator[tuple[Transport, Recorder]]:
    recorder = Recorder()
    transport = make_transport(
        kind, secret=peers.SECRET, source=recorder.lookup, sink=recorder.sink
    )
    transport.start("127.0.0.1:0")
    yield transport, recorder
    transport.close()


def _authenticated_socket(address: str) -> socket.socket:
    sock = socket.create_connection(parse_address(address), timeout=10)
    join_peer(sock, peers.SECRET, address)
    return sock


def _local_address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"{host}:{port}"


def _wait_for_warning(caplog: pytest.LogCaptureFixture, *parts: str) -> str:
    deadline_s = time.monotonic() + 10
    while time.monotonic() < deadline_s:
        for record in caplog.records:
            message = record.getMessage()
            if record.levelno >= logging.WARNING and all(part in message for part in parts):
                return message
        time.sleep(0.01)
    raise AssertionError(f"no warning with {parts}: {[r.getMessage() for r in caplog.records]}")


def test_truncated_push_is_dropped_naming_the_peer_and_the_server_keeps_serving(
    agent: tuple[Transport, Recorder], client: Transport, caplog: pytest.LogCaptureFixture
) -> None:
    transport, recorder = agent
    keys = peers.KEYS[:4]
    with _authenticated_socket(transport.address) as sock:
        me = _local_address(sock)
        header = HEADER.pack(MAGIC, Kind.PUSH, len(keys), 0, BLOCK, 99)
        sock.sendall(header + pack_u64s(keys) + bytes(BLOCK + 10))  # promises 4 blocks

    message = _wait_for_warning(caplog, me, "bytes missing")

    assert f"closed after {BLOCK + 10} of {4 * BLOCK} payload bytes" in message
    assert all(request_id != 99 for request_id, _ in recorder.pushes)
    client.push(transport.address, 100, keys, [recorder.blocks[key] for key in keys])
    assert (100, tuple(keys)) in recorder.pushes


def test_oversized_header_is_refused_before_anything_is_allocated(
    agent: tuple[Transport, Recorder], client: Transport, caplog: pytest.LogCaptureFixture
) -> None:
    transport, _ = agent
    with _authenticated_socket(transport.address) as sock:
        me = _local_address(sock)
        sock.sendall(HEADER.pack(MAGIC, Kind.PUSH, 60_000, 0, 60 << 20, 1))  # ~3.4 TiB
        assert sock.recv(1) == b""  # dropped at once: nothing was waited for

    message = _wait_for_warning(caplog, me, "announces 60000 blocks of 62914560 bytes")

    assert "limits" in message
    assert len(client.fetch(transport.address, peers.KEYS[:1])) == 1


def test_unknown_frame_kind_drops_only_that_connection(
    agent: tuple[Transport, Recorder], client: Transport, caplog: pytest.LogCaptureFixture
) -> None:
    transport, _ = agent
    with _authenticated_socket(transport.address) as sock:
        me = _local_address(sock)
        sock.sendall(HEADER.pack(MAGIC, 200, 0, 0, 0, 0))
        assert sock.recv(1) == b""

    _wait_for_warning(caplog, me, "unknown frame kind 200")
    assert len(client.fetch(transport.address, peers.KEYS[:1])) == 1


def test_connections_are_reused_across_requests(
    agent: tuple[Transport, Recorder], client: Transport
) -> None:
    transport, recorder = agent
    before = len(recorder.lookup_threads)
    for key in peers.KEYS[:3]:
        client.fetch(transport.address, [key])

    served_by = recorder.lookup_threads[before:]
    assert len(served_by) == 3
    assert len(set(served_by)) == 1  # one peer connection, one serving thread


def test_corrupt_push_is_refused_by_key_and_kept_from_the_sink(
    agent: tuple[Transport, Recorder], kind: str
) -> None:
    transport, recorder = agent
    keys = peers.KEYS[:2]
    blocks = [recorder.blocks[key] for key in keys]
    sums = [checksum(blocks[0]), checksum(blocks[1]) ^ 1]
    with _authenticated_socket(transport.address) as sock:
        if kind == "tcp":
            send_frame(
                sock,
                Kind.PUSH,
                keys,
                request_id=77,
                block_bytes=BLOCK,
                blocks=blocks,
                checksums=sums,
            )
            expected_bad = (keys[1],)
        else:  # leased a receive buffer, then commits without writing a byte into it
            send_frame(
                sock, Kind.PUSH_BEGIN, keys, request_id=77, block_bytes=BLOCK, checksums=sums
            )
            lease = read_frame(sock, transport.address, FrameLimits())
            assert lease.kind == Kind.LEASE
            send_frame(sock, Kind.PUSH_COMMIT, request_id=lease.request_id)
            expected_bad = tuple(keys)
        reply = read_frame(sock, transport.address, FrameLimits())

    assert reply.kind == Kind.ERR_CORRUPT
    assert reply.keys == expected_bad
    assert all(request_id != 77 for request_id, _ in recorder.pushes)


def test_a_flood_of_silent_connections_takes_no_slot_of_other_peers_and_logs_little(
    agent: tuple[Transport, Recorder], client: Transport, caplog: pytest.LogCaptureFixture
) -> None:
    """300 connections from one host (127.0.0.2) that never authenticate, more than all the
    slots there are: that host gets 8 slots to authenticate in, for 2 s each, so a peer
    already connected keeps being served, a new peer from another host gets in during the
    flood, and the refusals take a line or two, not one each."""
    transport, recorder = agent
    client.fetch(transport.address, [peers.KEYS[0]])  # a pooled, authenticated connection
    caplog.clear()
    flood = [
        socket.create_connection(parse_address(transport.address), source_address=("127.0.0.2", 0))
        for _ in range(300)
    ]
    try:
        newcomer = _authenticated_socket(transport.address)  # from 127.0.0.1
        newcomer.close()
        for key in peers.KEYS[1:4]:  # served through the flood
            assert bytes(client.fetch(transport.address, [key])[0]) == recorder.blocks[key]
    finally:
        for sock in flood:
            sock.close()
    refusals = [r for r in caplog.records if "refusing" in r.getMessage()]
    assert 1 <= len(refusals) <= 4, [r.getMessage() for r in refusals]
