"""Real checkpoints for LlamaModel: GGUF files and Hugging Face safetensors folders.

Both formats hold the same LLaMA weights under different names and layouts; `_OURS` maps
each of our parameters to its name in both, in one place. Three differences are handled
here and nowhere else:

- our q, k and v projections are one matrix (`qkv_weight`) and SwiGLU's gate and up are
  another (`gate_up_weight`): the checkpoint's parts are stacked in that order;
- llama.cpp's converter stores the q and k rows of each head interleaved for its rotary
  layout; our rotary embedding (like Hugging Face's) rotates the two halves of each head,
  so GGUF's q and k rows are put back (`_unpermute_rotary`);
- a checkpoint without an output head ties it to the token embedding.

GGUF tensors are dequantized (`gguf`, the llama.cpp project's reader) to fp32 and cast to
the model's dtype. A shape that does not fit the config, a missing tensor or an unsupported
architecture is a `CheckpointError` naming the tensor or the key.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from agents.model.config import ModelConfig


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded into LlamaModel, with what and where."""


@dataclass(slots=True)
class Checkpoint:
    """A checkpoint read into memory: its shape and its weights by their names there (the
    tokenizer it carries is read by backend.tokenizer.model_tokenizer)."""

    config: ModelConfig
    source: Path
    format: str  # "gguf" or "safetensors"
    tensors: dict[str, np.ndarray] = field(repr=False)


# Our parameter -> its parts' names in a GGUF file and in a Hugging Face folder. `{i}` is
# the layer; several parts are stacked along the rows in the order given.
_LAYER = {
    "input_norm.weight": (
        ["blk.{i}.attn_norm.weight"],
        ["model.layers.{i}.input_layernorm.weight"],
    ),
    "qkv_weight": (
        ["blk.{i}.attn_q.weight", "blk.{i}.attn_k.weight", "blk.{i}.attn_v.weight"],
        [f"model.layers.{{i}}.self_attn.{p}_proj.weight" for p in ("q", "k", "v")],
    ),
    "o_weight": (["blk.{i}.attn_output.weight"], ["model.layers.{i}.self_attn.o_proj.weight"]),
    "post_norm.weight": (
        ["blk.{i}.ffn_norm.weight"],
        ["model.layers.{i}.post_attention_layernorm.weight"],
    ),
    "gate_up_weight": (
        ["blk.{i}.ffn_gate.weight", "blk.{i}.ffn_up.weight"],
        ["model.layers.{i}.mlp.gate_proj.weight", "model.layers.{i}.mlp.up_proj.weight"],
    ),
    "down_weight": (["blk.{i}.ffn_down.weight"], ["model.layers.{i}.mlp.down_proj.weight"]),
}
_GLOBAL = {
    "embedding": (["token_embd.weight"], ["model.embed_tokens.weight"]),
    "norm.weight": (["output_norm.weight"], ["model.norm.weight"]),
    "lm_head": (["output.weight"], ["lm_head.weight"]),
}


def _ours(num_layers: int) -> dict[str, tuple[list[str], list[str]]]:
    names = dict(_GLOBAL)
    for i in range(num_layers):
        for ours, (gguf_parts, hf_parts) in _LAYER.items():
            names[f"layers.{i}.{ours}"] = (
                [p.format(i=i) for p in gguf_parts],
                [p.format(i=i) for p in hf_parts],
            )
    return names


def read_checkpoint(path: Path | str, *, weights: bool = True) -> Checkpoint:
    """A `.gguf` file or a folder with `config.json` and `*.safetensors`; with `weights`
    False only its shape (no tensor is read)."""
    path = Path(path)
    if path.is_dir():
        return _read_hf_folder(path, weights)
    if path.suffix == ".gguf" and path.is_file():
        return _read_gguf(path, weights)
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}")
    raise CheckpointError(
        f"{path}: not a checkpoint (want a .gguf file or a folder with config.json and "
        "*.safetensors)"
    )


def _read_gguf(path: Path, weights: bool) -> Checkpoint:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    try:
        reader = GGUFReader(path)
    except Exception as error:  # the reader raises what its parser met: say which file
        raise CheckpointError(
            f"{path.name}: not a readable GGUF file (truncated or damaged?): {error}"
        ) from None

    def value(key: str, default: object = KeyError) -> object:
        found = reader.fields.get(key)
        if found is None:
            if default is KeyError:
                raise CheckpointError(f"{path.name}: GGUF metadata lacks {key!r}")
            return default
        return found.contents()

    architecture = value("general.architecture")
    if architecture != "llama":
        raise CheckpointError(
            f"{path.name}: architecture {architecture!r} is not supported (only 'llama')"
        )
    config = ModelConfig(
        name=str(value("general.name", path.stem)),
        num_layers=int(value("llama.block_count")),
        hidden_size=int(value("llama.embedding_length")),
        num_heads=int(value("llama.attention.head_count")),
        num_kv_heads=int(value("llama.attention.head_count_kv")),
        ffn_size=int(value("llama.feed_forward_length")),
        vocab_size=int(value("llama.vocab_size", len(value("tokenizer.ggml.tokens")))),
        rope_theta=float(value("llama.rope.freq_base", 10_000.0)),
        rms_norm_eps=float(value("llama.attention.layer_norm_rms_epsilon")),
        tied_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
    )
    tensors: dict[str, np.ndarray] = {}
    for tensor in reader.tensors if weights else ():
        values = dequantize(tensor.data, tensor.tensor_type)
        if tensor.name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = config.num_heads if "attn_q" in tensor.name else config.num_kv_heads
            values = _unpermute_rotary(values, heads)
        tensors[tensor.name] = values
    return Checkpoint(config, path, "gguf", tensors)


def _unpermute_rotary(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order: per head, rows (0, half, 1, half + 1, ...) back to
    (0, 1, ..., half - 1, half, ...), the two halves our rotary embedding rotates."""
    rows, cols = weights.shape
    half = rows // num_heads // 2
    return weights.reshape(num_heads, half, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _read_hf_folder(folder: Path, weights: bool) -> Checkpoint:
    from safetensors.numpy import load_file

    config_file = folder / "config.json"
    files = sorted(folder.glob("*.safetensors"))
    if not config_file.is_file() or not files:
        raise CheckpointError(f"{folder}: a checkpoint folder needs config.json and *.safetensors")
    hf = json.loads(config_file.read_text())
    if hf.get("model_type") != "llama":
        raise CheckpointError(
            f"{config_file}: model_type {hf.get('model_type')!r} is not supported (only 'llama')"
        )
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}  # v5 / v4 names
    try:
        config = ModelConfig(
            name=str(hf.get("_name_or_path") or folder.name),
            num_layers=int(hf["num_hidden_layers"]),
            hidden_size=int(hf["hidden_size"]),
            num_heads=int(hf["num_attention_heads"]),
            num_kv_heads=int(hf.get("num_key_value_heads", hf["num_attention_heads"])),
            ffn_size=int(hf["intermediate_size"]),
            vocab_size=int(hf["vocab_size"]),
            rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10_000.0))),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tied_embeddings=bool(hf.get("tie_word_embeddings", False)),
        )
    except KeyError as missing:
        raise CheckpointError(f"{config_file}: lacks {missing.args[0]!r}") from None
    unsupported = {
        "rope type": rope.get("rope_type", rope.get("type", "default")) != "default",
        "attention_bias": bool(hf.get("attention_bias")),
        "mlp_bias": bool(hf.get("mlp_bias")),
        "head_dim": hf.get("head_dim", config.head_dim) != config.head_dim,
    }
    for what, found in unsupported.items():
        if found:
            raise CheckpointError(f"{config_file}: {what} {hf.get(what, rope)!r} is not supported")
    tensors: dict[str, np.ndarray] = {}
    for file in files if weights else ():
        tensors.update(load_file(file))
    return Checkpoint(config, folder, "safetensors", tensors)


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The shape of each of our parameters for `config` (rows first, as torch stores them)."""
    hidden, ffn, vocab = config.hidden_size, config.ffn_size, config.vocab_size
    shapes: dict[str, tuple[int, ...]] = {
        "embedding": (vocab, hidden),
        "norm.weight": (hidden,),
        "lm_head": (vocab, hidden),
    }
    layer = {
        "input_norm.weight": (hidden,),
        "qkv_weight": (hidden + 2 * config.kv_width, hidden),
        "o_weight": (hidden, hidden),
        "post_norm.weight": (hidden,),
        "gate_up_weight": (2 * ffn, hidden),
        "down_weight": (hidden, ffn),
    }
    for i in range(config.num_layers):
        shapes.update({f"layers.{i}.{name}": shape for name, shape in layer.items()})
    return shapes


def state_dict(checkpoint: Checkpoint, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Our parameters, by our names, from the checkpoint's tensors; a CheckpointError names
    a tensor that is missing or a shape that does not fit."""
    config = checkpoint.config
    column = 0 if checkpoint.format == "gguf" else 1
    state: dict[str, torch.Tensor] = {}
    expected = expected_shapes(config)
    for ours, names in _ours(config.num_layers).items():
        parts = names[column]
        if ours == "lm_head" and config.tied_embeddings:
            continue  # the model's head is its embedding (one parameter)
        missing = [p for p in parts if p not in checkpoint.tensors]
        if missing:
            raise CheckpointError(f"{checkpoint.source.name}: no tensor {missing[0]!r}")
        arrays = [checkpoint.tensors[p] for p in parts]
        if len(arrays) > 1 and len({a.shape[1:] for a in arrays}) > 1:
            shapes = ", ".join(f"{p} {list(a.shape)}" for p, a in zip(parts, arrays, strict=True))
            raise CheckpointError(f"{checkpoint.source.name}: parts do not stack: {shapes}")
        stacked = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)
        if stacked.shape != expected[ours]:
            shapes = ", ".join(f"{p} {list(a.shape)}" for p, a in zip(parts, arrays, strict=True))
            raise CheckpointError(
                f"{checkpoint.source.name}: {shapes} do not fit {ours} {list(expected[ours])} "
                f"of a {config.num_layers}-layer, hidden {config.hidden_size} model"
            )
        state[ours] = torch.from_numpy(np.require(stacked, np.float32, ["C", "W"])).to(dtype)
    return state
