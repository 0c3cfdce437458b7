"""The prompt KV a prefill agent pushes to a decode agent, and the decode side's inbox.

A push names its batch by an integer id; both sides derive it from the request id, so
the decode agent can match the KV to the DispatchDecode that follows.
"""

import threading
from collections import OrderedDict
from collections.abc import Sequence

import torch
import xxhash

from agents.model.kv_blocks import PagedKv, block_from_bytes, block_to_bytes
from agents.model.model import LlamaModel
from agents.transport import Transport


def transfer_id(request_id: str) -> int:
    """The data plane's 63-bit id of a request's hand-off."""
    return xxhash.xxh3_64_intdigest(request_id.encode()) & ((1 << 63) - 1)


def push_kv(transport: Transport, peer: str, request_id: str, kv: PagedKv) -> None:
    """Send the prompt's blocks (the last one zero-padded) to `peer`'s inbox."""
    blocks = [block_to_bytes(block) for block in kv.blocks]
    transport.push(peer, transfer_id(request_id), list(range(len(blocks))), blocks)


# Hand-offs cancelled lately, remembered so that KV still on its way is dropped on arrival.
MAX_DROPPED_IDS = 4096


class HandoffInbox:
    """Pushed KV by transfer id, until its DispatchDecode takes it. Thread safe."""

    def __init__(self, model: LlamaModel, block_size: int) -> None:
        self.model = model
        self.block_size = block_size
        self._blocks: dict[int, list[memoryview]] = {}
        self._dropped: OrderedDict[int, None] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._blocks)

    def put(self, push_id: int, keys: Sequence[int], blocks: Sequence[memoryview]) -> None:
        """The transport's block sink: blocks arrive in key order 0..n-1."""
        if list(keys) != list(range(len(keys))):
            raise ValueError("a KV hand-off must carry blocks 0..n-1 in order")
        with self._lock:
            if push_id not in self._dropped:
                self._blocks[push_id] = list(blocks)

    def drop(self, request_id: str) -> bool:
        """Forget the request's pushed KV (cancelled before its decode), and refuse what of
        it is still on its way; False if none had arrived."""
        push_id = transfer_id(request_id)
        with self._lock:
            self._dropped[push_id] = None
            while len(self._dropped) > MAX_DROPPED_IDS:
                self._dropped.popitem(last=False)
            return self._blocks.pop(push_id, None) is not None

    def take(self, request_id: str, num_tokens: int) -> PagedKv:
        """The request's KV as a PagedKv of `num_tokens`; KeyError if it never arrived."""
        with self._lock:
            views = self._blocks.pop(transfer_id(request_id), None)
        if views is None:
            raise KeyError(f"no KV was handed off for request {request_id!r}")
        config, dtype = self.model.config, self.model.dtype
        blocks = tuple(
            block_from_bytes(view, config, self.block_size, dtype, self.model.device)
            for view in views
        )
        return PagedKv(blocks, num_tokens, self.block_size)


def blocks_as_tensors(
    views: Sequence[memoryview | bytes], model: LlamaModel, block_size: int
) -> list[torch.Tensor]:
    return [block_from_bytes(v, model.config, block_size, model.dtype) for v in views]
