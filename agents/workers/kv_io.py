"""Where a prefill's KV comes from and goes to, one layer at a time: KvSource and KvSink.

The prefill worker only talks to these two small interfaces, so the pool shard and the
data plane plug in later. The implementations here hold blocks in memory; given an
executor they run loads and stores on its threads (the layer-wise schedule overlaps them
with compute), and a per-byte delay or a spill file makes stores cost what a storage tier
would.
"""

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from typing import Protocol, TypeVar

import torch

from agents.model.kv_blocks import LayerKv, layer_from_blocks

T = TypeVar("T")


class KvSource(Protocol):
    """The reused prefix: `num_tokens` tokens (whole blocks) of KV, loadable per layer."""

    num_tokens: int

    def start_load(self, layer: int) -> Future[LayerKv]: ...

    def wait(self, handle: Future[LayerKv]) -> LayerKv:
        """(k, v) of the handle's layer, each [num_kv_heads, num_tokens, head_dim]."""
        ...


class KvSink(Protocol):
    """Takes each layer's new KV as soon as it exists; completes stores only in wait_all."""

    def start_store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> Future[None]: ...

    def wait_all(self) -> list[torch.Tensor]:
        """Finish every store; return the stored blocks [num_layers, 2, H, B, D] in order."""
        ...


def _run(executor: Executor | None, function: Callable[..., T], *args: object) -> Future[T]:
    """Submit to `executor`, or run now and return an already completed future."""
    if executor is not None:
        return executor.submit(function, *args)
    future: Future[T] = Future()
    try:
        future.set_result(function(*args))
    except Exception as error:  # handed to whoever waits, as an executor would
        future.set_exception(error)
    return future


class BlockSource:
    """Prefix KV from block tensors in memory (e.g. over pool bytes, see block_from_bytes)."""

    def __init__(
        self,
        blocks: Sequence[torch.Tensor],
        *,
        device: torch.device | str = "cpu",
        executor: Executor | None = None,
        delay_s_per_byte: float = 0.0,
    ) -> None:
        self.blocks = tuple(blocks)
        self.block_size = int(self.blocks[0].shape[3]) if self.blocks else 0
        self.num_tokens = len(self.blocks) * self.block_size
        self.device = torch.device(device)
        self.executor = executor
        self.delay_s_per_byte = delay_s_per_byte

    def start_load(self, layer: int) -> Future[LayerKv]:
        return _run(self.executor, self._load, layer)

    def wait(self, handle: Future[LayerKv]) -> LayerKv:
        return handle.result()

    def _load(self, layer: int) -> LayerKv:
        k, v = layer_from_blocks(self.blocks, layer)
        if self.delay_s_per_byte:
            time.sleep(2 * k.numel() * k.element_size() * self.delay_s_per_byte)
        return k.to(self.device), v.to(self.device)


class BlockSink:
    """Assembles new full blocks layer by layer in preallocated host memory.

    Each start_store copies one layer's K and V into the blocks' buffer (optionally also
    writing those bytes to `spill_fd` at the offsets the serialised blocks would occupy,
    and sleeping `delay_s_per_byte` per byte); wait_all returns the finished blocks.
    """

    def __init__(
        self,
        num_layers: int,
        block_size: int,
        *,
        executor: Executor | None = None,
        delay_s_per_byte: float = 0.0,
        spill_fd: int | None = None,
    ) -> None:
        if num_layers <= 0 or block_size <= 0:
            raise ValueError("num_layers and block_size must be positive")
        self.num_layers = num_layers
        self.block_size = block_size
        self.executor = executor
        self.delay_s_per_byte = delay_s_per_byte
        self.spill_fd = spill_fd
        self._buffer: torch.Tensor | None = None
        self._pending: list[Future[None]] = []

    def start_store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> Future[None]:
        """Store k, v [num_kv_heads, num_blocks * block_size, head_dim] of full blocks."""
        if self._buffer is None:
            self._buffer = self._allocate(k)
        future = _run(self.executor, self._store, layer, k, v)
        self._pending.append(future)
        return future

    def wait_all(self) -> list[torch.Tensor]:
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()
        return [] if self._buffer is None else list(self._buffer.unbind(0))

    def _allocate(self, k: torch.Tensor) -> torch.Tensor:
        num_kv_heads, num_tokens, head_dim = k.shape
        if not num_tokens:
            raise ValueError("a store needs at least one full block")
        block_size = self.block_size
        if num_tokens % block_size:
            raise ValueError(f"{num_tokens} tokens are not whole blocks of {block_size}")
        shape = (num_tokens // block_size, self.num_layers, 2, num_kv_heads, block_size, head_dim)
        return torch.empty(shape, dtype=k.dtype, pin_memory=k.is_cuda)

    def _store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        buffer = self._buffer
        assert buffer is not None
        num_blocks, _, _, num_kv_heads, block_size, head_dim = buffer.shape
        for index, part in enumerate((k, v)):
            blocked = part.view(num_kv_heads, num_blocks, block_size, head_dim)
            buffer[:, layer, index].copy_(blocked.transpose(0, 1))
        if self.spill_fd is not None:
            block_bytes = buffer[0].numel() * buffer.element_size()
            layer_bytes = buffer[0, layer].numel() * buffer.element_size()
            for block_index in range(num_blocks):
                data = buffer[block_index, layer].reshape(-1).view(torch.uint8).numpy()
                os.pwrite(self.spill_fd, data, block_index * block_bytes + layer * layer_bytes)
        if self.delay_s_per_byte:
            time.sleep(2 * k.numel() * k.element_size() * self.delay_s_per_byte)
