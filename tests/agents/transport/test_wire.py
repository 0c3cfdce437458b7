"""Frames over a socket pair: sections, checksums, limits and truncation, byte by byte."""

import socket
import threading
from collections.abc import Iterator

import pytest

from agents.transport import (
    FrameLimits,
    FrameTooLargeError,
    MissingBlocksError,
    RemoteError,
    SourceBatch,
    TransportError,
    checksum,
    parse_address,
)
from agents.transport.base import check_batch, format_address, out_view
from agents.transport.frames import HEADER, MAGIC, Kind, pack_u64s
from agents.transport.serving import looked_up
from agents.transport.wire import read_frame, send_frame

PEER = "10.0.0.9:4000"


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    sender, receiver = socket.socketpair()
    receiver.settimeout(5)
    yield sender, receiver
    sender.close()
    receiver.close()


def _send_in_background(target, *args, **kwargs) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, kwargs=kwargs, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(("num_blocks", "block_bytes"), [(3000, 100), (8, 256 << 10)])
def test_a_batch_arrives_whole_with_its_checksums(pair, num_blocks: int, block_bytes: int):
    sender, receiver = pair
    keys = [(i * 0x9E3779B97F4A7C15) % 2**64 for i in range(num_blocks)]
    blocks = [bytes([i % 251]) * block_bytes for i in range(num_blocks)]

    thread = _send_in_background(
        send_frame, sender, Kind.PUSH, keys, request_id=5, block_bytes=block_bytes, blocks=blocks
    )
    frame = read_frame(receiver, PEER, FrameLimits())
    thread.join()

    assert frame.kind == Kind.PUSH and frame.request_id == 5
    assert frame.keys == tuple(keys)
    assert [bytes(block) for block in frame.blocks()] == blocks
    assert frame.checksums == tuple(checksum(block) for block in blocks)
    assert frame.bad_keys == ()


def test_a_block_that_does_not_match_its_checksum_is_named(pair) -> None:
    sender, receiver = pair
    blocks = [b"a" * 64, b"b" * 64]
    sums = [checksum(blocks[0]), checksum(b"not b")]

    send_frame(sender, Kind.BLOCKS, [1, 2], block_bytes=64, blocks=blocks, checksums=sums)
    frame = read_frame(receiver, PEER, FrameLimits())

    assert frame.bad_keys == (2,)


def test_a_header_beyond_the_limits_is_refused_before_reading_on(pair) -> None:
    sender, receiver = pair
    sender.sendall(HEADER.pack(MAGIC, Kind.BLOCKS, 10, 0, 1 << 20, 0))  # and nothing else

    with pytest.raises(FrameTooLargeError, match="10 blocks of 1048576 bytes") as caught:
        read_frame(receiver, PEER, FrameLimits(max_batch_bytes=8 << 20))

    assert caught.value.peer == PEER


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (HEADER.pack(b"HTTP", Kind.FETCH, 0, 0, 0, 0), "bad frame magic"),
        (HEADER.pack(MAGIC, 99, 0, 0, 0, 0), "unknown frame kind 99"),
        (HEADER.pack(MAGIC, Kind.PUSH, 2, 0, 0, 0), "2 blocks of 0 bytes"),
        (HEADER.pack(MAGIC, Kind.FETCH, 1 << 20, 0, 0, 0), "1048576 blocks"),
        (HEADER.pack(MAGIC, Kind.FETCH, 0, 1 << 20, 0, 0), "1048576 meta bytes"),
    ],
)
def test_malformed_headers_are_refused(pair, header: bytes, message: str) -> None:
    sender, receiver = pair
    sender.sendall(header)

    with pytest.raises(TransportError, match=message):
        read_frame(receiver, PEER, FrameLimits())


def test_a_truncated_batch_says_how_many_bytes_are_missing(pair) -> None:
    sender, receiver = pair
    sender.sendall(HEADER.pack(MAGIC, Kind.BLOCKS, 3, 0, 1000, 0) + pack_u64s([7, 8, 9]))
    sender.sendall(bytes(1500))
    sender.close()

    with pytest.raises(TransportError) as caught:
        read_frame(receiver, PEER, FrameLimits())

    assert str(caught.value) == (
        f"peer {PEER}: connection closed after 1500 of 3000 payload bytes of a BLOCKS batch "
        "of 3 blocks: 1500 bytes missing, incomplete from block 0x8 on"
    )


def test_blocks_land_in_the_callers_buffer_if_it_is_big_enough(pair) -> None:
    sender, receiver = pair
    out = bytearray(300)
    send_frame(sender, Kind.BLOCKS, [1, 2], block_bytes=100, blocks=[b"x" * 100, b"y" * 100])
    frame = read_frame(receiver, PEER, FrameLimits(), out=memoryview(out))
    assert bytes(out[:200]) == b"x" * 100 + b"y" * 100
    assert frame.blocks()[1].obj is out

    send_frame(sender, Kind.BLOCKS, [1, 2], block_bytes=200, blocks=[b"x" * 200, b"y" * 200])
    with pytest.raises(TransportError, match="more than the 300 bytes of out"):
        read_frame(receiver, PEER, FrameLimits(), out=memoryview(out))


def test_keys_must_be_unsigned_64_bit(pair) -> None:
    sender, receiver = pair
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        send_frame(sender, Kind.FETCH, [2**64])
    receiver.setblocking(False)
    with pytest.raises(BlockingIOError):
        receiver.recv(1)  # nothing half-sent


def test_batches_are_checked_before_sending() -> None:
    assert check_batch([1, 2], [b"ab", bytearray(b"cd")]) == 2
    with pytest.raises(ValueError, match="2 keys but 1 blocks"):
        check_batch([1, 2], [b"ab"])
    with pytest.raises(ValueError, match="one size"):
        check_batch([1, 2], [b"ab", b"c"])
    with pytest.raises(ValueError, match="empty"):
        check_batch([1], [b""])
    with pytest.raises(ValueError, match="writable"):
        out_view(b"read-only bytes")


def test_a_bad_source_batch_is_a_remote_error_and_is_still_released() -> None:
    released = []
    batch = SourceBatch([b"a", b"bb"], release=lambda: released.append(True))

    with pytest.raises(RemoteError, match="one size"), looked_up(lambda keys: batch, [1, 2]):
        pass

    assert released == [True]


def test_missing_blocks_error_is_a_key_error_naming_keys_and_peer() -> None:
    error = MissingBlocksError([0xAB, 0xCD], PEER)
    assert isinstance(error, KeyError)
    assert str(error) == f"peer {PEER}: does not hold block(s) 0xab, 0xcd"


@pytest.mark.parametrize(
    ("address", "parsed"),
    [
        ("127.0.0.1:80", ("127.0.0.1", 80)),
        ("[::1]:0", ("::1", 0)),
        ("node-3:9000", ("node-3", 9000)),
    ],
)
def test_addresses_parse_and_format_back(address: str, parsed: tuple[str, int]) -> None:
    assert parse_address(address) == parsed
    assert format_address(*parsed) == address


@pytest.mark.parametrize("address", ["127.0.0.1", ":80", "host:http", "host:70000", ""])
def test_bad_addresses_are_refused_by_name(address: str) -> None:
    with pytest.raises(ValueError, match="host:port"):
        parse_address(address)
