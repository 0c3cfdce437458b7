"""The decoder's building blocks: RMSNorm, rotary embeddings, GQA attention and SwiGLU.

Tensors of one layer's KV are laid out [num_kv_heads, num_tokens, head_dim], the same
order as a KV block (agents.model.kv_blocks), so blocks and caches slice without copies.
"""

import torch
import torch.nn.functional as F
from torch import nn

from agents.model.config import ModelConfig

SPLIT_GATE_UP_MAX_ROWS = 64  # a decode batch's size at most (see DecoderLayer.finish)


def seeded_weight(
    shape: tuple[int, ...], generator: torch.Generator, device: torch.device, dtype: torch.dtype
) -> nn.Parameter:
    """A dummy weight drawn N(0, 1/fan_in) from `generator`, so activations keep their scale."""
    fan_in = shape[-1]
    values = torch.randn(shape, generator=generator, device=device, dtype=torch.float32)
    return nn.Parameter((values * fan_in**-0.5).to(dtype), requires_grad=False)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, device=device, dtype=dtype), False)
        self.eps = eps

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 as LLaMA does, whatever the model dtype.
        variance = hidden.float().pow(2).mean(-1, keepdim=True)
        normed = hidden.float() * torch.rsqrt(variance + self.eps)
        return normed.to(hidden.dtype) * self.weight


def rotary_tables(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [num_tokens, head_dim] for absolute `positions`."""
    exponents = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32)
    inv_freq = theta ** (-exponents / head_dim)
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [num_tokens, heads, head_dim] by its positions' angles (rotate-half form)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_cached_tokens: int
) -> torch.Tensor:
    """Attention of new queries q [heads, n, D] over k, v [kv_heads, cached + n, D].

    Query i sits at position num_cached_tokens + i and sees keys up to it. Returns
    [n, heads * D].
    """
    num_new = q.shape[1]
    if 0 < num_cached_tokens < 2 * num_new:
        # SDPA's is_causal aligns its mask top-left, ours is offset by the cached prefix, and
        # an explicit mask drops SDPA onto a path that computes the whole rectangle at about
        # half speed. With a prefix shorter than twice the new tokens (measured crossover on
        # CPU) it is cheaper to put zero queries in front and run the fast causal kernel
        # over the whole context, then drop their rows.
        padding = q.new_zeros(q.shape[0], num_cached_tokens, q.shape[2])
        out = F.scaled_dot_product_attention(
            torch.cat([padding, q], dim=1)[None], k[None], v[None], is_causal=True, enable_gqa=True
        )[:, :, num_cached_tokens:]
    else:
        mask = None
        if num_cached_tokens:
            key_positions = torch.arange(k.shape[1], device=q.device)
            query_positions = torch.arange(num_new, device=q.device) + num_cached_tokens
            mask = key_positions[None, :] <= query_positions[:, None]
        out = F.scaled_dot_product_attention(
            q[None], k[None], v[None], attn_mask=mask, is_causal=mask is None, enable_gqa=True
        )
    return out[0].transpose(0, 1).reshape(num_new, -1)


class DecoderLayer(nn.Module):
    """One pre-norm LLaMA layer, split at attention so callers own the KV in between."""

    def __init__(
        self,
        config: ModelConfig,
        generator: torch.Generator,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        hidden, kv_width, ffn = config.hidden_size, config.kv_width, config.ffn_size
        self.config = config
        self.input_norm = RMSNorm(hidden, config.rms_norm_eps, device, dtype)
        # q, k and v in one matrix: one matmul instead of three.
        self.qkv_weight = seeded_weight((hidden + 2 * kv_width, hidden), generator, device, dtype)
        self.o_weight = seeded_weight((hidden, hidden), generator, device, dtype)
        self.post_norm = RMSNorm(hidden, config.rms_norm_eps, device, dtype)
        # SwiGLU gate and up in one matrix, then down.
        self.gate_up_weight = seeded_weight((2 * ffn, hidden), generator, device, dtype)
        self.down_weight = seeded_weight((hidden, ffn), generator, device, dtype)

    def project_qkv(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [heads, n, D] and this layer's new k, v [kv_heads, n, D] for hidden [n, size]."""
        config = self.config
        num_tokens = hidden.shape[0]
        qkv = F.linear(self.input_norm(hidden), self.qkv_weight)
        q, k, v = qkv.split((config.hidden_size, config.kv_width, config.kv_width), dim=-1)
        q = apply_rotary(q.view(num_tokens, config.num_heads, config.head_dim), cos, sin)
        k = apply_rotary(k.view(num_tokens, config.num_kv_heads, config.head_dim), cos, sin)
        v = v.view(num_tokens, config.num_kv_heads, config.head_dim)
        return q.transpose(0, 1), k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()

    def finish(self, hidden: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """Output projection, residual, SwiGLU and residual: the layer's output [n, size]."""
        hidden = hidden + F.linear(attention, self.o_weight)
        normed = self.post_norm(hidden)
        if hidden.shape[0] <= SPLIT_GATE_UP_MAX_ROWS:
            # A decode batch: gate and up as two products over the halves of the one matrix
            # (views, no copy). Measured on SmolLM2's shapes on a 2-core CPU: two 1536-wide
            # products take a 4-8 row batch in 2/3 of the time of one 3072-wide, level
            # elsewhere up to 256 rows, 4 % slower at 1024 (hence one product for prefills).
            ffn = self.config.ffn_size
            gate = F.linear(normed, self.gate_up_weight[:ffn])
            up = F.linear(normed, self.gate_up_weight[ffn:])
        else:
            gate, up = F.linear(normed, self.gate_up_weight).chunk(2, dim=-1)
        return hidden + F.linear(F.silu(gate) * up, self.down_weight)
