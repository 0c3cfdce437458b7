"""The LLaMA-architecture model the workers run: presets, seeded weights and KV blocks."""

from agents.model.config import PRESETS, ModelConfig, get_preset
from agents.model.kv_blocks import (
    LayerKv,
    PagedKv,
    block_from_bytes,
    block_shape,
    block_to_bytes,
    layer_byte_range,
    layer_from_blocks,
)
from agents.model.model import LlamaModel, build_model, default_device, default_dtype

__all__ = [
    "PRESETS",
    "LayerKv",
    "LlamaModel",
    "ModelConfig",
    "PagedKv",
    "block_from_bytes",
    "block_shape",
    "block_to_bytes",
    "build_model",
    "default_device",
    "default_dtype",
    "get_preset",
    "layer_byte_range",
    "layer_from_blocks",
]
