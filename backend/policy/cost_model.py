"""The cost model the Conductor believes: prefill, decode-step and KV transfer times.

Forms (chosen for their physical shape, coefficients fitted by least squares from profile
points of the real worker):

    prefill_s(input, cached)   = fixed_s + per_token_s * n
                                 + per_token_pair_s * n * (input + cached) / 2
                                 with n = input - cached new tokens; the last term counts the
                                 query-key pairs of causal attention over the new tokens.
    decode_step_s(batch, ctx)  = fixed_s + per_request_s * batch + per_context_token_s * ctx
                                 (weights are read once per step; attention reads every
                                 context token's KV).
    transfer_s(tokens, backlog)= latency_s + tokens * kv_bytes_per_token / bandwidth + backlog_s
                                 (bandwidth: the pair's measured one where known,
                                 backend.policy.links)
    serving path               = dispatch_s (arrival to the prefill agent taking the call)
                                 + answer_s (the agent's answer back to the Conductor)
                                 + first_token_s (the answer to the first token leaving the
                                 Conductor) + per_token_s (each streamed gap beyond the
                                 decode step); measured live, zero in offline profiles.
                                 A profile measured before answer_s existed holds the way
                                 back in dispatch_s. handover_s: a prefill agent's worker
                                 going from one prefill to the next waiting, once per
                                 request ahead in the queue estimate.

A profile is the JSON-ready dict form of a CostModel (`to_profile` / `from_profile`). The
twin executes with its own timing model; this is only what the policy predicts.
"""

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

PROFILE_FORMAT = "kvcentric-profile/1"


@dataclass(frozen=True, slots=True)
class PrefillFit:
    """Coefficients of the prefill-time form."""

    fixed_s: float
    per_token_s: float
    per_token_pair_s: float = 0.0

    def time_s(self, input_tokens: int, cached_tokens: int) -> float:
        new_tokens = input_tokens - cached_tokens
        if new_tokens <= 0:
            # The last token is always recomputed to produce the first output token.
            new_tokens = 1
        return (
            self.fixed_s
            + self.per_token_s * new_tokens
            + self.per_token_pair_s * new_tokens * (input_tokens + cached_tokens) * 0.5
        )


@dataclass(frozen=True, slots=True)
class DecodeFit:
    """Coefficients of the decode-step-time form."""

    fixed_s: float
    per_request_s: float
    per_context_token_s: float

    def step_s(self, batch_size: int, context_tokens: int) -> float:
        if batch_size <= 0:
            return 0.0
        return (
            self.fixed_s
            + self.per_request_s * batch_size
            + self.per_context_token_s * context_tokens
        )


@dataclass(frozen=True, slots=True)
class LinkModel:
    """One network link between two pool shards."""

    bandwidth_bytes_per_s: float
    latency_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ServingFit:
    """The serving path's own costs, beyond the prefill and decode work (seconds)."""

    dispatch_s: float = 0.0  # arrival to the prefill agent taking the call
    first_token_s: float = 0.0  # the agent's answer to the first token leaving
    per_token_s: float = 0.0
    answer_s: float = 0.0  # the agent's answer on its way back to the Conductor
    # A prefill agent's line handing its worker from one prefill to the next waiting (each
    # request queued or running ahead of a new one adds one; not part of the TTFT overhead).
    handover_s: float = 0.0

    @property
    def ttft_overhead_s(self) -> float:
        """What the path adds to a request's time to first token."""
        return self.dispatch_s + self.answer_s + self.first_token_s


@dataclass(frozen=True, slots=True)
class CostModel:
    """Prefill, decode and transfer time estimates for one model on one kind of instance."""

    prefill: PrefillFit
    decode: DecodeFit
    link: LinkModel
    kv_bytes_per_token: int
    name: str = "unnamed"
    serving: ServingFit = ServingFit()

    def __post_init__(self) -> None:
        if self.kv_bytes_per_token <= 0:
            raise ValueError(f"kv_bytes_per_token must be positive, got {self.kv_bytes_per_token}")
        if self.link.bandwidth_bytes_per_s <= 0:
            raise ValueError("link bandwidth must be positive")
        fits = (("prefill", self.prefill), ("decode", self.decode), ("serving", self.serving))
        for label, fit in fits:
            for field, value in asdict(fit).items():
                if not (math.isfinite(value) and value >= 0):
                    raise ValueError(f"{label}.{field} must be a finite non-negative number")

    def prefill_time_s(self, input_tokens: int, cached_tokens: int) -> float:
        return self.prefill.time_s(input_tokens, cached_tokens)

    def decode_step_time_s(self, batch_size: int, context_tokens: int) -> float:
        return self.decode.step_s(batch_size, context_tokens)

    def transfer_time_s(
        self, num_tokens: int, backlog_s: float = 0.0, seconds_per_byte: float | None = None
    ) -> float:
        """Latency, bytes over the link and the backlog ahead; `seconds_per_byte` is a
        measured pair's (backend.policy.links), else the profile's bandwidth is used."""
        if num_tokens <= 0:
            return 0.0
        if seconds_per_byte is None:
            seconds_per_byte = 1.0 / self.link.bandwidth_bytes_per_s
        seconds = num_tokens * self.kv_bytes_per_token * seconds_per_byte
        return self.link.latency_s + seconds + backlog_s

    # -- profiles -------------------------------------------------------------------------
    def to_profile(self) -> dict[str, Any]:
        """The JSON-ready profile dict of this model."""
        return {
            "format": PROFILE_FORMAT,
            "name": self.name,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "prefill": asdict(self.prefill),
            "decode": asdict(self.decode),
            "link": asdict(self.link),
            "serving": asdict(self.serving),
        }

    @classmethod
    def from_profile(cls, profile: Mapping[str, Any]) -> "CostModel":
        """Build from a profile dict; fits coefficients from `*_points` when they are absent."""
        try:
            if "prefill" in profile:
                prefill = PrefillFit(**profile["prefill"])
            else:
                prefill = fit_prefill(
                    (p["input_tokens"], p["cached_tokens"], p["seconds"])
                    for p in profile["prefill_points"]
                )
            if "decode" in profile:
                decode = DecodeFit(**profile["decode"])
            else:
                decode = fit_decode(
                    (p["batch_size"], p["context_tokens"], p["seconds"])
                    for p in profile["decode_points"]
                )
            return cls(
                prefill=prefill,
                decode=decode,
                link=LinkModel(**profile["link"]),
                kv_bytes_per_token=int(profile["kv_bytes_per_token"]),
                name=str(profile.get("name", "unnamed")),
                serving=ServingFit(**profile.get("serving", {})),
            )
        except KeyError as missing:
            raise ValueError(f"profile lacks {missing}") from None
        except TypeError as bad:
            raise ValueError(f"profile has a malformed section: {bad}") from None

    @classmethod
    def reference_70b(cls) -> "CostModel":
        """A LLaMA2-70B-shaped instance of 8 A800-class GPUs, for defaults and benchmarks.

        ~140 GFLOP per token at ~1.1 PFLOP/s effective gives ~8,000 tokens/s of prefill;
        KV is 80 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes = 327,680 bytes/token;
        links move 100 GB/s (800 Gbps RDMA).
        """
        return cls(
            prefill=PrefillFit(fixed_s=0.02, per_token_s=1 / 8000, per_token_pair_s=4e-9),
            decode=DecodeFit(fixed_s=0.025, per_request_s=2e-4, per_context_token_s=3e-8),
            link=LinkModel(bandwidth_bytes_per_s=100e9, latency_s=1e-4),
            kv_bytes_per_token=327_680,
            name="reference-llama2-70b-8xa800",
        )


def _nonnegative_least_squares(columns: Sequence[np.ndarray], target: np.ndarray) -> list[float]:
    """Least squares with every coefficient >= 0: drop the most negative term and refit.

    With at most three terms this active-set loop ends in at most three fits.
    """
    active = list(range(len(columns)))
    while active:
        design = np.column_stack([columns[i] for i in active])
        solution, *_ = np.linalg.lstsq(design, target, rcond=None)
        worst = int(np.argmin(solution))
        if solution[worst] >= 0:
            coefficients = [0.0] * len(columns)
            for position, column in enumerate(active):
                coefficients[column] = float(solution[position])
            return coefficients
        del active[worst]
    return [0.0] * len(columns)


def _robust_fit(
    columns: Sequence[np.ndarray], target: np.ndarray, *, robust: bool
) -> tuple[list[float], np.ndarray]:
    """Non-negative least squares; `robust`: refit once without the points whose residual
    is beyond 3 scaled MADs (a stalled step, a GC pause), if enough points remain.
    Returns the coefficients and the mask of the points kept."""
    kept = np.ones(len(target), dtype=bool)
    coefficients = _nonnegative_least_squares(columns, target)
    if not robust:
        return coefficients, kept
    predicted = np.column_stack(columns) @ np.asarray(coefficients)
    residuals = target - predicted
    mad = float(np.median(np.abs(residuals - np.median(residuals))))
    limit = max(3.0 * 1.4826 * mad, 1e-9)
    kept = np.abs(residuals) <= limit
    if kept.sum() >= max(3, len(target) // 2) and not kept.all():
        coefficients = _nonnegative_least_squares([c[kept] for c in columns], target[kept])
    else:
        kept = np.ones(len(target), dtype=bool)
    return coefficients, kept


def prefill_columns(inputs: np.ndarray, cached: np.ndarray) -> list[np.ndarray]:
    """The prefill form's terms for each (input, cached) point: 1, n, n * (input + cached) / 2."""
    new = np.maximum(inputs - cached, 1.0)
    return [np.ones_like(new), new, new * (inputs + cached) * 0.5]


def fit_prefill(points: Iterable[tuple[int, int, float]], *, robust: bool = False) -> PrefillFit:
    """Fit the prefill form to (input_tokens, cached_tokens, seconds) measurements."""
    rows = np.array(list(points), dtype=float)
    if rows.ndim != 2 or len(rows) < 3:
        raise ValueError("need at least three prefill points to fit the prefill model")
    inputs, cached, seconds = rows[:, 0], rows[:, 1], rows[:, 2]
    (fixed, per_token, per_pair), _ = _robust_fit(
        prefill_columns(inputs, cached), seconds, robust=robust
    )
    return PrefillFit(fixed_s=fixed, per_token_s=per_token, per_token_pair_s=per_pair)


def fit_decode(points: Iterable[tuple[int, int, float]], *, robust: bool = False) -> DecodeFit:
    """Fit the decode-step form to (batch_size, context_tokens, seconds) measurements."""
    rows = np.array(list(points), dtype=float)
    if rows.ndim != 2 or len(rows) < 3:
        raise ValueError("need at least three decode points to fit the decode model")
    batch, context, seconds = rows[:, 0], rows[:, 1], rows[:, 2]
    (fixed, per_request, per_context), _ = _robust_fit(
        [np.ones_like(batch), batch, context], seconds, robust=robust
    )
    return DecodeFit(fixed_s=fixed, per_request_s=per_request, per_context_token_s=per_context)
