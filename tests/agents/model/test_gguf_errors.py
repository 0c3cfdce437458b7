"""A GGUF file that cannot be served gets one clear error line: another architecture, a
truncated file, a missing tensor, a tensor of the wrong shape. The files are written with
the gguf package's own writer (small random llama shapes)."""

from pathlib import Path

import numpy as np
import pytest

from agents.model import build_model
from agents.model.checkpoint import CheckpointError, read_checkpoint

HIDDEN, FFN, HEADS, KV_HEADS, LAYERS, VOCAB = 32, 64, 4, 2, 2, 64


def tensors(*, skip: str = "", ffn: int = FFN) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    head_dim = HIDDEN // HEADS
    shapes = {"token_embd.weight": (VOCAB, HIDDEN), "output_norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        shapes |= {
            f"blk.{i}.attn_norm.weight": (HIDDEN,),
            f"blk.{i}.attn_q.weight": (HIDDEN, HIDDEN),
            f"blk.{i}.attn_k.weight": (KV_HEADS * head_dim, HIDDEN),
            f"blk.{i}.attn_v.weight": (KV_HEADS * head_dim, HIDDEN),
            f"blk.{i}.attn_output.weight": (HIDDEN, HIDDEN),
            f"blk.{i}.ffn_norm.weight": (HIDDEN,),
            f"blk.{i}.ffn_gate.weight": (ffn, HIDDEN),
            f"blk.{i}.ffn_up.weight": (ffn, HIDDEN),
            f"blk.{i}.ffn_down.weight": (HIDDEN, ffn),
        }
    return {
        name: rng.standard_normal(shape).astype(np.float32)
        for name, shape in shapes.items()
        if name != skip
    }


def write_gguf(path: Path, *, architecture: str = "llama", **options) -> Path:
    from gguf import GGUFWriter

    writer = GGUFWriter(path, architecture)
    writer.add_block_count(LAYERS)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10_000.0)
    writer.add_vocab_size(VOCAB)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(VOCAB)])
    for name, array in tensors(**options).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_well_formed_small_gguf_loads(tmp_path):
    model = build_model(str(write_gguf(tmp_path / "small.gguf")), device="cpu")
    assert model.config.num_layers == LAYERS and model.config.tied_embeddings


def test_another_architecture_is_one_clear_error(tmp_path):
    path = write_gguf(tmp_path / "other.gguf", architecture="qwen2")
    with pytest.raises(CheckpointError, match=r"^other\.gguf: architecture 'qwen2' is not"):
        read_checkpoint(path)


def test_a_truncated_file_is_one_clear_error(tmp_path):
    whole = write_gguf(tmp_path / "whole.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(CheckpointError, match=r"^cut\.gguf: not a readable GGUF file"):
        read_checkpoint(cut)


def test_a_missing_tensor_is_named(tmp_path):
    path = write_gguf(tmp_path / "missing.gguf", skip="blk.1.attn_v.weight")
    with pytest.raises(CheckpointError, match=r"no tensor 'blk\.1\.attn_v\.weight'"):
        build_model(str(path), device="cpu")


def test_a_wrong_shape_names_the_tensors_and_the_model(tmp_path):
    path = write_gguf(tmp_path / "shape.gguf", ffn=48)
    with pytest.raises(CheckpointError, match=r"blk\.0\.ffn_gate\.weight \[48, 32\].*gate_up"):
        build_model(str(path), device="cpu")
