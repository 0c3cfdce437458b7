"""Model shapes: the named presets, their parameter counts, KV bytes per token and FLOPs.

Pure arithmetic on shapes, so the large presets (llama2-7b .. llama2-70b) can be sized for
profiling and docs without ever allocating their weights.
"""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A LLaMA-architecture decoder's shape (grouped-query attention, SwiGLU, an output head
    of its own unless `tied_embeddings`)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_size: int
    vocab_size: int
    rope_theta: float = 10_000.0
    rms_norm_eps: float = 1e-5
    # The output head is the token embedding (SmolLM2); the dummy presets draw their own.
    tied_embeddings: bool = False

    def __post_init__(self) -> None:
        for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_size"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} must be positive, got {getattr(self, field)}")
        if self.vocab_size <= 0:
            raise ValueError(f"vocab_size must be positive, got {self.vocab_size}")
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be a multiple of num_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even for rotary embeddings")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_width(self) -> int:
        """Width of one token's K (or V) in one layer: num_kv_heads * head_dim."""
        return self.num_kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        """Weights of one decoder layer: q, k, v, o projections, SwiGLU and two norms."""
        attention = 2 * self.hidden_size * self.hidden_size + 2 * self.hidden_size * self.kv_width
        mlp = 3 * self.hidden_size * self.ffn_size
        return attention + mlp + 2 * self.hidden_size

    @property
    def num_params(self) -> int:
        """All weights: embedding, layers, final norm and the output head (unless tied)."""
        embeddings = (1 if self.tied_embeddings else 2) * self.vocab_size * self.hidden_size
        return embeddings + self.num_layers * self.layer_params + self.hidden_size

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """num_layers x 2 (K, V) x num_kv_heads x head_dim x dtype_bytes."""
        return self.num_layers * 2 * self.kv_width * dtype_bytes

    def block_bytes(self, block_size: int, dtype_bytes: int) -> int:
        """Bytes of one KV block of `block_size` tokens (see agents.model.kv_blocks)."""
        return block_size * self.kv_bytes_per_token(dtype_bytes)

    def prefill_flops(self, input_tokens: int, cached_tokens: int = 0) -> float:
        """FLOPs of a prefill computing `input_tokens - cached_tokens` new tokens.

        2 per weight per new token for the layers' matrices, 4 * num_heads * head_dim per
        causal query-key pair per layer (QK^T and PV), and the output head for the last
        position only (the worker computes no other logits). At least one token is new.
        """
        cached_tokens = min(cached_tokens, input_tokens - 1)
        new_tokens = input_tokens - cached_tokens
        # Query i (0-based among the new ones) sees cached_tokens + i + 1 keys.
        pairs = new_tokens * cached_tokens + new_tokens * (new_tokens + 1) / 2
        matrix_params = self.num_layers * (self.layer_params - 2 * self.hidden_size)
        return (
            2.0 * matrix_params * new_tokens
            + 4.0 * self.num_heads * self.head_dim * self.num_layers * pairs
            + 2.0 * self.hidden_size * self.vocab_size
        )

    def decode_flops(self, batch_size: int, context_tokens: int) -> float:
        """FLOPs of one decode step: `batch_size` new tokens over `context_tokens` in all."""
        matrix_params = self.num_layers * (self.layer_params - 2 * self.hidden_size)
        return (
            2.0 * (matrix_params + self.hidden_size * self.vocab_size) * batch_size
            + 4.0 * self.num_heads * self.head_dim * self.num_layers * context_tokens
        )


def _llama(name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int) -> ModelConfig:
    return ModelConfig(name, layers, hidden, heads, kv_heads, ffn, vocab_size=32_000)


PRESETS: dict[str, ModelConfig] = {
    # tiny: a 2k-token prefill in ~0.1 s on two CPU cores; used by every CPU test.
    "tiny": _llama("tiny", 4, 256, 8, 2, 768),
    "small": _llama("small", 8, 512, 8, 2, 1536),
    "medium": _llama("medium", 16, 1024, 16, 4, 2816),
    "llama2-7b": _llama("llama2-7b", 32, 4096, 32, 32, 11008),
    "llama2-13b": _llama("llama2-13b", 40, 5120, 40, 40, 13824),
    "llama2-70b": _llama("llama2-70b", 80, 8192, 64, 8, 28672),
}


def get_preset(name: str) -> ModelConfig:
    """The preset called `name`; a ValueError listing the presets for an unknown one."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(
            f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}"
        ) from None
