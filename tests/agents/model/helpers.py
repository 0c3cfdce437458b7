"""Helpers of the model and worker suites: the shared tiny model and seeded prompts."""

from functools import cache

import numpy as np

from agents.model import LlamaModel, build_model

BLOCK_SIZE = 16


@cache
def tiny_cpu_model() -> LlamaModel:
    """The `tiny` preset, fp32 on CPU, seed 0, built once (tests compare within 1e-4)."""
    return build_model("tiny", seed=0, device="cpu")


def prompt(num_tokens: int, seed: int) -> np.ndarray:
    """Seeded int32 token ids below the tiny vocabulary."""
    return np.random.default_rng(seed).integers(0, 32_000, size=num_tokens, dtype=np.int32)
