"""LlamaModel: the seeded dummy-weight decoder, its device and dtype choice, and a full pass.

Workers drive the layers one by one (embed, then per layer project_qkv / attention /
finish, then logits) so that they own KV loading and storing between layers.
"""

import torch
from torch import nn

from agents.model.config import ModelConfig, get_preset
from agents.model.layers import (
    DecoderLayer,
    RMSNorm,
    causal_attention,
    rotary_tables,
    seeded_weight,
)


def default_device() -> torch.device:
    """CUDA when present, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """fp32 on CPU; on CUDA bf16 where the GPU supports it, else fp16."""
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


class LlamaModel(nn.Module):
    """A LLaMA-architecture decoder whose weights are a pure function of (config, seed)."""

    def __init__(
        self,
        config: ModelConfig,
        *,
        seed: int = 0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.device = torch.device(device) if device is not None else default_device()
        self.dtype = dtype if dtype is not None else default_dtype(self.device)
        generator = torch.Generator(device=self.device)
        generator.manual_seed(seed)
        args = (generator, self.device, self.dtype)
        embedding = torch.randn(
            (config.vocab_size, config.hidden_size), generator=generator, device=self.device
        )
        self.embedding = nn.Parameter(embedding.to(self.dtype), requires_grad=False)
        self.layers = nn.ModuleList(DecoderLayer(config, *args) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, self.device, self.dtype)
        # The output head is an ordinary (vocab, hidden) weight drawn N(0, 1/hidden).
        self.lm_head = seeded_weight((config.vocab_size, config.hidden_size), *args)

    @property
    def kv_dtype_bytes(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Hidden states [n, size] of token ids [n]; ids outside the vocabulary raise."""
        token_ids = token_ids.to(self.device)
        if token_ids.numel() and (
            int(token_ids.min()) < 0 or int(token_ids.max()) >= self.config.vocab_size
        ):
            raise ValueError(f"token ids must lie in [0, {self.config.vocab_size})")
        return self.embedding[token_ids]

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin tables for absolute positions [n]."""
        config = self.config
        return rotary_tables(
            positions.to(self.device), config.head_dim, config.rope_theta, self.dtype
        )

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Output logits [n, vocab] (fp32) of final-layer hidden states [n, size]."""
        return (self.norm(hidden) @ self.lm_head.T).float()

    @torch.no_grad()
    def full_prefill(
        self, token_ids: torch.Tensor
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Reference pass without any reuse: last-position logits and every layer's (k, v)."""
        hidden = self.embed(token_ids)
        cos, sin = self.rotary(torch.arange(hidden.shape[0]))
        kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        for layer in self.layers:
            q, k, v = layer.project_qkv(hidden, cos, sin)
            hidden = layer.finish(hidden, causal_attention(q, k, v, 0))
            kv.append((k, v))
        return self.logits(hidden[-1:])[0], kv


def build_model(
    preset: str | ModelConfig,
    *,
    seed: int = 0,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> LlamaModel:
    """A model of a preset name or config; device and dtype default to CUDA/bf16 or CPU/fp32."""
    config = get_preset(preset) if isinstance(preset, str) else preset
    return LlamaModel(config, seed=seed, device=device, dtype=dtype)
