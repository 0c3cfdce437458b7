"""RequestKvCache: one decoding request's KV, filled from its paged blocks and grown in place."""

import torch

from agents.model.kv_blocks import PagedKv


class RequestKvCache:
    """Per layer K and V [num_kv_heads, capacity_tokens, head_dim]; the first `num_tokens` valid.

    Preallocated to the request's final length (prompt + max_tokens), so a decode step
    writes one position per layer and never reallocates.
    """

    def __init__(
        self, paged: PagedKv, capacity_tokens: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        if capacity_tokens < paged.num_tokens:
            raise ValueError("capacity_tokens must hold at least the prompt")
        num_layers, _, num_kv_heads, _, head_dim = paged.blocks[0].shape
        shape = (num_layers, num_kv_heads, capacity_tokens, head_dim)
        self.k = torch.empty(shape, device=device, dtype=dtype)
        self.v = torch.empty(shape, device=device, dtype=dtype)
        position = 0
        for block in paged.blocks:
            count = min(paged.block_size, paged.num_tokens - position)
            block = block.to(device=device, dtype=dtype)
            self.k[:, :, position : position + count] = block[:, 0, :, :count]
            self.v[:, :, position : position + count] = block[:, 1, :, :count]
            position += count
        self.num_tokens = paged.num_tokens

    @property
    def capacity_tokens(self) -> int:
        return self.k.shape[2]

    def write(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Put the next position's k, v [num_kv_heads, head_dim] in `layer`; return its KV so far.

        Call `advance()` once all layers are written.
        """
        position = self.num_tokens
        if position >= self.capacity_tokens:
            raise ValueError("the request's KV cache is full")
        self.k[layer, :, position] = k
        self.v[layer, :, position] = v
        return self.k[layer, :, : position + 1], self.v[layer, :, : position + 1]

    def advance(self) -> None:
        self.num_tokens += 1
