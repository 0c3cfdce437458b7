"""PrefillWorker: computes a prompt's uncached tokens with layer-wise KV loading and storing.

The schedule, per layer l: project q, k, v of the new tokens; wait for
layer l's reused prefix KV and start loading layer l+1's; attend; then start an
asynchronous store of layer l's new KV and go on without waiting. All stores are waited
for once, at the end. Only whole blocks are reused and the last token is always computed.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from agents.model.kv_blocks import LayerKv, PagedKv
from agents.model.layers import causal_attention
from agents.model.model import LlamaModel
from agents.workers.kv_io import BlockSink, KvSink, KvSource
from backend.policy.blocks import block_keys


@dataclass(frozen=True, slots=True)
class PrefillTimings:
    """Wall times of one prefill; `*_wait_s` are the parts spent blocked on I/O."""

    total_s: float
    load_wait_s: float
    store_wait_s: float


@dataclass(frozen=True, slots=True)
class PrefillResult:
    """What a prefill produces for the pool, the decode agent and the first token."""

    logits: torch.Tensor  # [vocab] fp32 logits of the last prompt position
    num_tokens: int
    num_cached_tokens: int  # reused prefix tokens (whole blocks)
    new_block_keys: tuple[int, ...]  # chained keys of the new full blocks, in order
    new_blocks: tuple[torch.Tensor, ...]  # their KV, [num_layers, 2, H, B, D] each
    layers: tuple[LayerKv, ...]  # the whole prompt's (k, v) per layer, for the decode hand-off
    timings: PrefillTimings

    def paged_kv(self, block_size: int) -> PagedKv:
        """The prompt's KV as blocks (last one padded), as it travels to a decode agent."""
        return PagedKv.from_layers(list(self.layers), block_size)


def as_token_tensor(token_ids: Sequence[int] | np.ndarray | torch.Tensor) -> torch.Tensor:
    """Token ids as a 1-D int64 CPU tensor."""
    if not isinstance(token_ids, torch.Tensor):
        token_ids = torch.from_numpy(np.asarray(token_ids, dtype=np.int64))
    tensor = token_ids.to(device="cpu", dtype=torch.int64)
    if tensor.ndim != 1 or tensor.numel() == 0:
        raise ValueError("a prompt must be a non-empty 1-D sequence of token ids")
    return tensor


class PrefillWorker:
    """Runs prefills of one model with blocks of `block_size` tokens."""

    def __init__(self, model: LlamaModel, block_size: int) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.model = model
        self.block_size = block_size

    def reusable_tokens(self, num_tokens: int, offered_tokens: int) -> int:
        """Prefix tokens to reuse: whole blocks, never the last token."""
        usable_blocks = (num_tokens - 1) // self.block_size
        return min(offered_tokens // self.block_size, usable_blocks) * self.block_size

    @torch.no_grad()
    def prefill(
        self,
        token_ids: Sequence[int] | np.ndarray | torch.Tensor,
        *,
        source: KvSource | None = None,
        sink: KvSink | None = None,
        on_layer: Callable[[int], None] | None = None,
    ) -> PrefillResult:
        """Prefill `token_ids`, reusing `source`'s prefix and storing new full blocks to `sink`.

        `source` must hold the KV of the prompt's first blocks (looked up by their keys).
        `on_layer(l)` is called right before layer l's attention (for tracing).
        """
        started_s = time.perf_counter()
        model, block_size = self.model, self.block_size
        tokens = as_token_tensor(token_ids)
        num_tokens = tokens.numel()
        offered = source.num_tokens if source is not None else 0
        if offered % block_size:
            raise ValueError(f"a source must offer whole blocks of {block_size}, got {offered}")
        cached = self.reusable_tokens(num_tokens, offered)
        num_cached_blocks = cached // block_size
        num_new_blocks = num_tokens // block_size - num_cached_blocks
        if sink is None:
            sink = BlockSink(model.config.num_layers, block_size)

        hidden = model.embed(tokens[cached:])
        cos, sin = model.rotary(torch.arange(cached, num_tokens))
        load_wait_s = 0.0
        loading = source.start_load(0) if source is not None and cached else None
        layers: list[LayerKv] = []
        for index, layer in enumerate(model.layers):
            q, k, v = layer.project_qkv(hidden, cos, sin)
            if loading is not None:
                assert source is not None
                wait_started_s = time.perf_counter()
                prefix_k, prefix_v = source.wait(loading)
                load_wait_s += time.perf_counter() - wait_started_s
                is_last = index + 1 == len(model.layers)
                loading = None if is_last else source.start_load(index + 1)
                prefix_k = prefix_k[:, :cached].to(k.device, k.dtype)
                prefix_v = prefix_v[:, :cached].to(v.device, v.dtype)
                k_all, v_all = torch.cat((prefix_k, k), dim=1), torch.cat((prefix_v, v), dim=1)
            else:
                k_all, v_all = k, v
            if on_layer is not None:
                on_layer(index)
            hidden = layer.finish(hidden, causal_attention(q, k_all, v_all, cached))
            if num_new_blocks:
                full = num_new_blocks * block_size
                sink.start_store(index, k[:, :full], v[:, :full])
            layers.append((k_all, v_all))
        logits = model.logits(hidden[-1:])[0]

        store_started_s = time.perf_counter()
        new_blocks = sink.wait_all()
        done_s = time.perf_counter()
        keys = block_keys(tokens.numpy().astype(np.int32), block_size)[num_cached_blocks:]
        return PrefillResult(
            logits=logits,
            num_tokens=num_tokens,
            num_cached_tokens=cached,
            new_block_keys=tuple(keys),
            new_blocks=tuple(new_blocks),
            layers=tuple(layers),
            timings=PrefillTimings(
                total_s=done_s - started_s,
                load_wait_s=load_wait_s,
                store_wait_s=done_s - store_started_s,
            ),
        )
