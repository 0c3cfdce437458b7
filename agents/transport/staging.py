"""Staging buffers of the Mooncake path: registered-memory stand-ins for blocks, reused.

Mooncake moves only registered memory, so blocks are copied into one staging buffer per
batch. A fresh 64 MiB buffer costs more in page faults than the copy itself, so buffers
whose contents nobody holds any more (a released fetch lease, a finished push) are kept
for the next batch of the same size.
"""

import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from agents.transport.errors import TransportError
from agents.transport.frames import Buffer


class StagingBuffers:
    """Up to `max_buffers` idle uint8 buffers, reused by exact size, oldest dropped first."""

    def __init__(self, max_buffers: int = 4) -> None:
        self._idle: OrderedDict[int, list[np.ndarray]] = OrderedDict()
        self._max_buffers = max_buffers
        self._lock = threading.Lock()

    def take(self, num_bytes: int) -> np.ndarray:
        with self._lock:
            idle = self._idle.get(num_bytes)
            if idle:
                return idle.pop()
        return np.empty(num_bytes, dtype=np.uint8)

    def give_back(self, buffer: np.ndarray) -> None:
        """Keep `buffer` for reuse; only call it when no view of it is held anywhere."""
        with self._lock:
            self._idle.setdefault(buffer.nbytes, []).append(buffer)
            self._idle.move_to_end(buffer.nbytes)
            while sum(len(idle) for idle in self._idle.values()) > self._max_buffers:
                oldest = next(iter(self._idle))
                self._idle[oldest].pop(0)
                if not self._idle[oldest]:
                    del self._idle[oldest]


def stage(blocks: Sequence[Buffer], block_bytes: int, buffers: StagingBuffers) -> np.ndarray:
    """The blocks copied back to back into one staging buffer (this path's one copy)."""
    staging = buffers.take(len(blocks) * block_bytes)
    view = memoryview(staging)
    for i, block in enumerate(blocks):
        view[i * block_bytes : (i + 1) * block_bytes] = memoryview(block).cast("B")
    return staging


def landing(into: memoryview | None, num_bytes: int, peer: str) -> np.ndarray:
    """Where fetched bytes land: the caller's `out`, else a fresh buffer the caller keeps."""
    if into is None:
        return np.empty(num_bytes, dtype=np.uint8)
    if len(into) < num_bytes:
        raise TransportError(peer, f"leased {num_bytes} bytes, more than the {len(into)} of out")
    return np.frombuffer(into, dtype=np.uint8, count=num_bytes)


def split(buffer: np.ndarray, num_blocks: int) -> list[memoryview]:
    """One view per block of a staging buffer (no copy)."""
    view, size = memoryview(buffer), buffer.nbytes // max(num_blocks, 1)
    return [view[i * size : (i + 1) * size] for i in range(num_blocks)]
