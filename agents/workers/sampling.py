"""Token sampling: greedy, or seeded temperature / top-k sampling with one generator per request;
and the log-probabilities a client may ask for with each token."""

from dataclasses import dataclass

import torch

# Below this a temperature is greedy: softmax(logits / t) is one-hot already, and dividing
# fp32 logits by, say, 1e-40 overflows to inf and NaN probabilities.
MIN_TEMPERATURE = 1e-6
MAX_TOP_LOGPROBS = 20  # OpenAI's limit on alternatives per token


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """temperature 0 (or under MIN_TEMPERATURE) is greedy; otherwise sample from
    softmax(logits / temperature)."""

    temperature: float = 0.0
    top_k: int = 0  # 0 keeps the whole vocabulary
    seed: int = 0
    ignore_eos: bool = False  # keep decoding past the model's stop tokens, to max_tokens
    logprobs: bool = False  # report each token's log-probability
    top_logprobs: int = 0  # and this many most likely tokens with theirs

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}]")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE

    def generator(self) -> torch.Generator | None:
        """A CPU generator seeded with `seed`, or None when greedy."""
        if self.is_greedy:
            return None
        generator = torch.Generator()
        generator.manual_seed(self.seed)
        return generator


GREEDY = SamplingParams()


def sample(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None
) -> int:
    """One token id from fp32 logits [vocab].

    Sampling draws on the CPU so a seed gives the same tokens on any device.
    """
    if params.is_greedy:
        return int(torch.argmax(logits))
    if generator is None:
        raise ValueError("sampling with temperature > 0 needs the request's seeded generator")
    scaled = logits.float().cpu() / params.temperature
    if params.top_k:
        kept = torch.topk(scaled, min(params.top_k, scaled.numel()))
        choice = torch.multinomial(torch.softmax(kept.values, -1), 1, generator=generator)
        return int(kept.indices[choice])
    return int(torch.multinomial(torch.softmax(scaled, -1), 1, generator=generator))


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A sampled token's log-probability and the `top` most likely (token, log-probability)
    pairs, most likely first."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprob(logits: torch.Tensor, token: int, params: SamplingParams) -> TokenLogprob | None:
    """The log-softmax of fp32 logits [vocab] at `token` (the model's distribution, before
    temperature or top-k), with `params.top_logprobs` alternatives; None unless asked for."""
    if not params.logprobs:
        return None
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    top: tuple[tuple[int, float], ...] = ()
    if params.top_logprobs:
        values, indices = torch.topk(logprobs, min(params.top_logprobs, logprobs.numel()))
        top = tuple(zip(indices.tolist(), values.tolist(), strict=True))
    return TokenLogprob(float(logprobs[token]), top)
