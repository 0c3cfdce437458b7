"""Hugging Face safetensors folders into our model, and the errors a bad checkpoint gets.

A small LLaMA made and saved by transformers (random weights, tied and untied heads) must
give transformers' logits in our LlamaModel; a checkpoint that does not fit names the tensor
or key that does not.
"""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from agents.model import build_model
from agents.model.checkpoint import CheckpointError, read_checkpoint
from agents.model.registry import resolve_model

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="transformers (the reference) is not installed: pip install -e '.[dev]'",
)


def save_small_llama(folder: Path, *, tied: bool) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=50_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tied,
    )
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder, safe_serialization=True)
    return model


@pytest.mark.parametrize("tied", [False, True])
def test_a_safetensors_folder_gives_transformers_logits(tmp_path, tied):
    reference = save_small_llama(tmp_path, tied=tied)
    ours = build_model(str(tmp_path), device="cpu")
    assert ours.config.tied_embeddings is tied
    tokens = torch.arange(3, 40)
    logits, _ = ours.full_prefill(tokens)
    with torch.no_grad():
        expected = reference(tokens[None]).logits[0, -1]
    assert torch.allclose(logits, expected, atol=1e-4, rtol=0)


def test_a_shape_that_does_not_fit_names_the_tensor(tmp_path):
    save_small_llama(tmp_path, tied=False)
    config = json.loads((tmp_path / "config.json").read_text())
    config["intermediate_size"] = 128
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.mlp\.gate_proj\.weight"):
        build_model(str(tmp_path), device="cpu")


def test_a_missing_tensor_is_named(tmp_path):
    from safetensors.numpy import load_file, save_file

    save_small_llama(tmp_path, tied=False)
    (file,) = tmp_path.glob("*.safetensors")
    tensors = load_file(file)
    del tensors["model.layers.1.self_attn.v_proj.weight"]
    save_file(tensors, file)
    with pytest.raises(CheckpointError, match=r"no tensor 'model\.layers\.1\.self_attn\.v_proj"):
        build_model(str(tmp_path), device="cpu")


def test_another_architecture_is_refused(tmp_path):
    save_small_llama(tmp_path, tied=False)
    config = json.loads((tmp_path / "config.json").read_text())
    config["model_type"] = "mistral"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="model_type 'mistral' is not supported"):
        read_checkpoint(tmp_path)


def test_a_folder_without_weights_and_a_wrong_file_are_clear(tmp_path):
    with pytest.raises(CheckpointError, match=r"needs config\.json and"):
        read_checkpoint(tmp_path)
    other = tmp_path / "weights.bin"
    other.write_bytes(np.zeros(4, np.float32).tobytes())
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        read_checkpoint(other)


def test_model_names_resolve_to_presets_real_models_or_paths(tmp_path):
    assert resolve_model("tiny").dummy
    with pytest.raises(ValueError, match=r"unknown model 'nope'.*tiny.*smollm2-135m"):
        resolve_model("nope")
    save_small_llama(tmp_path, tied=True)
    assert resolve_model(str(tmp_path)).checkpoint == tmp_path
