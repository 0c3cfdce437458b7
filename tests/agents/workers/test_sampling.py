"""Sampling and the log-probabilities a client may ask for with each token."""

import pytest
import torch

from agents.workers.sampling import GREEDY, SamplingParams, sample, token_logprob


def test_log_probabilities_are_the_models_before_temperature_and_only_when_asked() -> None:
    logits = torch.tensor([2.0, 0.5, -1.0, 3.0])
    assert token_logprob(logits, 3, GREEDY) is None
    hot = SamplingParams(temperature=1.7, top_k=2, seed=1, logprobs=True, top_logprobs=3)
    token = sample(logits, hot, hot.generator())
    result = token_logprob(logits, token, hot)
    expected = torch.log_softmax(logits, -1)  # the model's distribution, not the sampler's
    assert result.logprob == pytest.approx(float(expected[token]))
    assert [t for t, _ in result.top] == [3, 0, 1]  # most likely first
    assert [v for _, v in result.top] == pytest.approx(expected[[3, 0, 1]].tolist())
    only = token_logprob(logits, 2, SamplingParams(logprobs=True))
    assert only.top == () and only.logprob == pytest.approx(float(expected[2]))


def test_too_many_alternatives_are_refused() -> None:
    with pytest.raises(ValueError, match="top_logprobs must be in"):
        SamplingParams(logprobs=True, top_logprobs=21)
