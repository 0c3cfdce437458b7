"""The torch model: seeded weights, fp32 on CPU, and the reference full prefill."""

import pytest
import torch

from agents.model import build_model, default_dtype
from tests.agents.model.helpers import prompt


def test_same_seed_gives_same_weights_and_another_seed_does_not():
    first = build_model("tiny", seed=3, device="cpu")
    again = build_model("tiny", seed=3, device="cpu")
    other = build_model("tiny", seed=4, device="cpu")
    for a, b in zip(first.parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(first.layers[0].qkv_weight, other.layers[0].qkv_weight)


def test_cpu_defaults_to_fp32_and_dtype_can_be_overridden():
    assert default_dtype(torch.device("cpu")) == torch.float32
    model = build_model("tiny", device="cpu", dtype=torch.bfloat16)
    assert model.embedding.dtype == torch.bfloat16
    assert model.kv_dtype_bytes == 2


def test_full_prefill_shapes_and_causality(tiny_model):
    tokens = torch.as_tensor(prompt(40, seed=1), dtype=torch.int64)
    logits, kv = tiny_model.full_prefill(tokens)
    config = tiny_model.config
    assert logits.shape == (config.vocab_size,)
    assert len(kv) == config.num_layers
    assert kv[0][0].shape == (config.num_kv_heads, 40, config.head_dim)
    # Causal: the KV of the first 30 tokens does not depend on the 10 after them.
    _, short_kv = tiny_model.full_prefill(tokens[:30])
    assert torch.allclose(short_kv[-1][1], kv[-1][1][:, :30], atol=1e-5)


def test_token_ids_outside_the_vocabulary_are_refused(tiny_model):
    with pytest.raises(ValueError, match="token ids"):
        tiny_model.full_prefill(torch.tensor([1, 2, 32_000]))
