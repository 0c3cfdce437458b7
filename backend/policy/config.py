"""PolicyConfig: the knobs of the policy core and nothing else, validated on construction."""

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from backend.policy.eviction import DEFAULT_EVICTION_POLICY

PrefillScheduler = Literal["kvcache-centric", "cache-aware", "load-balancing", "random"]
RejectionPolicy = Literal["none", "baseline", "early", "early-predicted"]
EvictionPolicy = Literal["prefix-lru", "lru", "lfu", "length-aware"]

PREFILL_SCHEDULERS: tuple[str, ...] = ("kvcache-centric", "cache-aware", "load-balancing", "random")
REJECTION_POLICIES: tuple[str, ...] = ("none", "baseline", "early", "early-predicted")
EVICTION_POLICIES: tuple[str, ...] = ("prefix-lru", "lru", "lfu", "length-aware")
_INT_FIELDS = ("block_size", "decode_time_window", "seed", "max_in_flight_requests")
_NUMBER_FIELDS = (
    "kvcache_balancing_threshold",
    "ttft_slo_s",
    "tbt_slo_s",
    "decode_time_s",
    "predicted_load_limit",
    "predicted_size_weight",
)


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Everything the Conductor's decisions depend on besides the cluster's state.

    SLO defaults follow the paper's recipe (10x single-request TTFT, 5x TBT) for the
    reference LLaMA2-70B cost model; a deployment sets them from its own measurements.
    """

    block_size: int = 512
    prefill_scheduler: PrefillScheduler = "kvcache-centric"
    # Fetch a remote prefix when it is at least this many times longer than the local one.
    kvcache_balancing_threshold: float = 2.0
    rejection_policy: RejectionPolicy = "early-predicted"
    eviction_policy: EvictionPolicy = DEFAULT_EVICTION_POLICY
    ttft_slo_s: float = 30.0
    tbt_slo_s: float = 0.1
    # t_d: the uniform decode time early-predicted assumes for every decoding request.
    decode_time_s: float = 20.0
    # early-predicted's forecast of each request's decode: learned from the last
    # `decode_time_window` completions (its max_tokens times the share requests really
    # generate, times their seconds per token), or off: every request decodes for the
    # uniform t_d `decode_time_s` (the paper's form).
    learn_decode_time: bool = True
    decode_time_window: int = 256
    # early-predicted admits while the predicted decode load stays at or under this: below
    # 1.0 keeps headroom for the forecast's error, above it trusts the decode instance's own
    # check on arrival to catch the rest (less refused, more prefill wasted).
    predicted_load_limit: float = 1.05
    # ... with the request's own KV share of that load counted this many times: near the
    # limit, large requests are refused first and small ones still fit, so the pool's
    # memory holds more requests (docs/overload.md measures 1-25; 1 is the plain forecast).
    predicted_size_weight: float = 10.0
    seed: int = 0
    # Requests admitted and not yet ended, cluster-wide; past it admission refuses
    # ("in_flight_limit"), in the live Conductor and in the twin alike.
    max_in_flight_requests: int = 1024

    def __post_init__(self) -> None:
        self._check_types()
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.prefill_scheduler not in PREFILL_SCHEDULERS:
            raise ValueError(
                f"unknown prefill_scheduler {self.prefill_scheduler!r}; "
                f"choose one of {', '.join(PREFILL_SCHEDULERS)}"
            )
        if self.rejection_policy not in REJECTION_POLICIES:
            raise ValueError(
                f"unknown rejection_policy {self.rejection_policy!r}; "
                f"choose one of {', '.join(REJECTION_POLICIES)}"
            )
        if self.eviction_policy not in EVICTION_POLICIES:
            raise ValueError(
                f"unknown eviction_policy {self.eviction_policy!r}; "
                f"choose one of {', '.join(EVICTION_POLICIES)}"
            )
        threshold = self.kvcache_balancing_threshold
        if math.isnan(threshold) or threshold < 1.0:
            raise ValueError(f"kvcache_balancing_threshold must be in [1, inf], got {threshold}")
        for name in ("ttft_slo_s", "tbt_slo_s", "decode_time_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number of seconds, got {value}")
        limit = self.predicted_load_limit
        if not (limit > 0 and math.isfinite(limit)):
            raise ValueError(f"predicted_load_limit must be a positive number, got {limit}")
        weight = self.predicted_size_weight
        if not (weight >= 1 and math.isfinite(weight)):
            raise ValueError(f"predicted_size_weight must be a number >= 1, got {weight}")
        if self.decode_time_window <= 0:
            raise ValueError(f"decode_time_window must be positive, got {self.decode_time_window}")
        if self.max_in_flight_requests <= 0:
            raise ValueError(
                f"max_in_flight_requests must be positive, got {self.max_in_flight_requests}"
            )

    def _check_types(self) -> None:
        """Refuse values of the wrong type (64.0 for an int, true for a number), which
        comparisons alone let through from JSON."""
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        for name in _NUMBER_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name} must be a number, got {value!r}")
        if not isinstance(self.learn_decode_time, bool):
            value = self.learn_decode_time
            raise ValueError(f"learn_decode_time must be true or false, got {value!r}")
        for name in ("prefill_scheduler", "rejection_policy", "eviction_policy"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string, got {getattr(self, name)!r}")

    @property
    def effective_threshold(self) -> float:
        """The threshold Algorithm 1 uses: cache-aware is the algorithm at threshold inf."""
        if self.prefill_scheduler == "kvcache-centric":
            return self.kvcache_balancing_threshold
        return math.inf

    @property
    def checks_decode_on_arrival(self) -> bool:
        """Whether a decode instance re-checks the TBT SLO when a request reaches it."""
        return self.rejection_policy != "none"


# -- the one JSON codec (settings, REST, database, twin, console) ---------------------------
_INFINITIES = frozenset({"inf", "+inf", "-inf", "infinity", "+infinity", "-infinity"})


def json_safe(value: Any) -> Any:
    """`value` for strict JSON, which has no infinity (nor PostgreSQL's JSON type): every
    non-finite float, however deep, becomes its string ("inf", "-inf", "nan")."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


def number_from_json(value: Any) -> Any:
    """The inverse for one number: "inf" / "infinity" (any sign and case) is a float
    infinity; anything else is left as it is, for the reader to check."""
    if isinstance(value, str) and value.strip().lower() in _INFINITIES:
        return float(value)
    return value


def policy_to_json(config: PolicyConfig) -> dict[str, Any]:
    """The configuration as strict JSON carries it, by PolicyConfig's names."""
    return json_safe(asdict(config))


def policy_from_json(data: Mapping[str, Any]) -> dict[str, Any]:
    """Settings read back from JSON (all or some of them): numbers decoded, the rest left for
    PolicyConfig to check."""
    return {
        name: number_from_json(value) if name in _NUMBER_FIELDS else value
        for name, value in data.items()
    }
