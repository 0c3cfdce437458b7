"""LlamaModel: the LLaMA decoder (seeded dummy weights, or a real checkpoint's), its device
and dtype choice, and a full pass.

Workers drive the layers one by one (embed, then per layer project_qkv / attention /
finish, then logits) so that they own KV loading and storing between layers.
"""

import torch
from torch import nn

from agents.model.config import ModelConfig
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
        if config.tied_embeddings:  # one tensor, as the checkpoint has (saves vocab x hidden)
            self.lm_head = self.embedding
        else:
            self.lm_head = seeded_weight((config.vocab_size, config.hidden_size), *args)

    @torch.no_grad()
    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Replace every weight by `state`'s (agents.model.checkpoint.state_dict), each
        checked against this model's shape; a missing or extra name is an error."""
        own = dict(self.named_parameters())
        if set(state) != set(own):
            missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
            raise ValueError(f"weights do not match the model: missing {missing}, extra {extra}")
        for name, parameter in own.items():
            if state[name].shape != parameter.shape:
                shape, own_shape = list(state[name].shape), list(parameter.shape)
                raise ValueError(f"{name}: shape {shape} != the model's {own_shape}")
            parameter.copy_(state[name].to(parameter.device, parameter.dtype))

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
    """A model of a name or config; device and dtype default to CUDA/bf16 or CPU/fp32.

    A name is a dummy preset (seeded random weights), a real model of the registry
    (`smollm2-135m`) or a checkpoint's path (agents.model.registry)."""
    if isinstance(preset, ModelConfig):
        return LlamaModel(preset, seed=seed, device=device, dtype=dtype)
    from agents.model.registry import resolve_model

    source = resolve_model(preset)
    if source.checkpoint is None:
        return LlamaModel(source.config, seed=seed, device=device, dtype=dtype)
    from agents.model.checkpoint import read_checkpoint, state_dict

    checkpoint = read_checkpoint(source.checkpoint)
    model = LlamaModel(checkpoint.config, seed=seed, device=device, dtype=dtype)
    model.load_weights(state_dict(checkpoint, model.dtype))
    return model
