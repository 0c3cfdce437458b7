"""KV blocks: their layout, their bytes, and a request's KV as a list of blocks (PagedKv).

One block holds the KV of `block_size` consecutive tokens of every layer, as one contiguous
tensor of shape

    [num_layers, 2 (K, V), num_kv_heads, block_size, head_dim]

in the model's dtype (fp32 on CPU, bf16/fp16 on CUDA), so its size is
`block_size * config.kv_bytes_per_token(dtype_bytes)`. Layer-major order makes one layer's
K and V one contiguous byte range of the block (`layer_byte_range`): a layer-wise load
reads exactly that slice of every block. Blocks travel as bytes (the pool shard stores
bytes, the transport moves bytes): `block_to_bytes` and `block_from_bytes` view a
contiguous CPU tensor as bytes and back without copying.
"""

import warnings
from dataclasses import dataclass

import torch

from agents.model.config import ModelConfig

LayerKv = tuple[torch.Tensor, torch.Tensor]
"""One layer's (k, v), each [num_kv_heads, num_tokens, head_dim]."""


def block_shape(config: ModelConfig, block_size: int) -> tuple[int, int, int, int, int]:
    """[num_layers, 2, num_kv_heads, block_size, head_dim]."""
    return (config.num_layers, 2, config.num_kv_heads, block_size, config.head_dim)


def layer_byte_range(config: ModelConfig, block_size: int, dtype_bytes: int, layer: int) -> range:
    """The bytes of layer `layer`'s K then V inside one serialised block."""
    layer_bytes = 2 * config.num_kv_heads * block_size * config.head_dim * dtype_bytes
    return range(layer * layer_bytes, (layer + 1) * layer_bytes)


def block_to_bytes(block: torch.Tensor) -> memoryview:
    """The block's bytes: a view of its memory for a contiguous CPU tensor, else one copy."""
    block = block.detach()
    if block.device.type != "cpu":
        block = block.cpu()
    flat = block.contiguous().reshape(-1).view(torch.uint8)
    return memoryview(flat.numpy())


def block_from_bytes(
    data: bytes | bytearray | memoryview,
    config: ModelConfig,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """A block tensor over `data`; on CPU it shares `data`'s memory (no copy).

    A tensor over read-only bytes must not be written to.
    """
    expected = config.block_bytes(block_size, torch.empty((), dtype=dtype).element_size())
    if len(memoryview(data).cast("B")) != expected:
        raise ValueError(f"a block of this shape has {expected} bytes, got {len(data)}")
    with warnings.catch_warnings():
        # torch warns that read-only buffers give tensors that must not be written; we
        # document that instead of copying every block.
        warnings.simplefilter("ignore", UserWarning)
        tensor = torch.frombuffer(data, dtype=dtype)
    return tensor.view(block_shape(config, block_size)).to(device)


@dataclass(frozen=True, slots=True)
class PagedKv:
    """A request's KV as whole blocks; the last may be partly filled (`num_tokens` counts)."""

    blocks: tuple[torch.Tensor, ...]
    num_tokens: int
    block_size: int

    def __post_init__(self) -> None:
        needed = -(-self.num_tokens // self.block_size)
        if len(self.blocks) != needed:
            raise ValueError(
                f"{self.num_tokens} tokens need {needed} blocks, got {len(self.blocks)}"
            )

    @classmethod
    def from_layers(cls, layers: list[LayerKv], block_size: int) -> "PagedKv":
        """Cut per-layer (k, v) [kv_heads, n, D] into blocks, padding the last with zeros."""
        k0 = layers[0][0]
        num_kv_heads, num_tokens, head_dim = k0.shape
        num_blocks = -(-num_tokens // block_size)
        paged = k0.new_zeros((len(layers), 2, num_kv_heads, num_blocks * block_size, head_dim))
        for index, (k, v) in enumerate(layers):
            paged[index, 0, :, :num_tokens] = k
            paged[index, 1, :, :num_tokens] = v
        # [L, 2, H, nb * B, D] -> nb blocks of [L, 2, H, B, D], each made contiguous.
        split = paged.view(len(layers), 2, num_kv_heads, num_blocks, block_size, head_dim)
        blocks = split.permute(3, 0, 1, 2, 4, 5).contiguous()
        return cls(tuple(blocks.unbind(0)), num_tokens, block_size)

    def layer(self, layer: int) -> LayerKv:
        """Layer `layer`'s (k, v) over the first `num_tokens` tokens, [kv_heads, n, D] each."""
        return layer_from_blocks(self.blocks, layer, self.num_tokens)

    @property
    def nbytes(self) -> int:
        return sum(block.numel() * block.element_size() for block in self.blocks)


def layer_from_blocks(
    blocks: tuple[torch.Tensor, ...] | list[torch.Tensor], layer: int, num_tokens: int | None = None
) -> LayerKv:
    """Concatenate one layer's K and V across blocks: ([kv_heads, n, D], [kv_heads, n, D])."""
    if not blocks:
        raise ValueError("no blocks to read a layer from")
    joined = torch.cat([block[layer] for block in blocks], dim=2)
    if num_tokens is not None:
        joined = joined[:, :, :num_tokens]
    return joined[0], joined[1]
