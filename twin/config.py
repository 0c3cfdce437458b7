"""TwinConfig: one simulated cluster and the policy it runs, validated with one-line errors."""

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from backend.policy.config import (
    EVICTION_POLICIES,
    PREFILL_SCHEDULERS,
    REJECTION_POLICIES,
    PolicyConfig,
    json_safe,
    number_from_json,
    policy_from_json,
)

_POLICY = PolicyConfig()  # the defaults the twin shares with the Conductor


@dataclass(frozen=True, slots=True)
class TwinConfig:
    """What to simulate. Capacities left at None come from the timing profile."""

    num_prefill: int = 8
    num_decode: int = 8
    scheduler: str = "kvcache-centric"
    rejection: str = "early-predicted"
    threshold: float = 2.0
    eviction: str = _POLICY.eviction_policy
    # None: the paper's rule, 10x the TTFT and 5x the TBT of a lone request of the trace's
    # mean length on this profile (twin.slo.derive_slos).
    ttft_slo_s: float | None = None
    tbt_slo_s: float | None = None
    decode_time_s: float = _POLICY.decode_time_s
    learn_decode_time: bool = _POLICY.learn_decode_time
    predicted_load_limit: float = _POLICY.predicted_load_limit
    predicted_size_weight: float = _POLICY.predicted_size_weight
    decode_time_window: int = _POLICY.decode_time_window
    max_in_flight_requests: int = _POLICY.max_in_flight_requests
    # Replay speed: 2.0 replays the trace's arrivals twice as fast.
    speed: float = 1.0
    profile: str = "paper"
    # Relative standard deviation of Gaussian noise on every executed duration.
    noise: float = 0.0
    seed: int = 0
    dram_capacity_blocks: int | None = None
    ssd_capacity_blocks: int | None = None
    decode_kv_capacity_tokens: int | None = None
    # Chunked pipeline prefill: groups of this many prefill instances; 1 turns it off.
    pipeline_group: int = 1
    prefill_chunk_tokens: int = 16_384
    block_size: int = 512
    series_interval_s: float = 10.0
    # Refit the core's cost model online from the twin's own measurements, as the live
    # Conductor does from its agents' (backend/policy/calibration.py, its defaults): the
    # twin of a live cluster believes what live would come to believe under the change.
    calibrate: bool = False

    def __post_init__(self) -> None:
        if self.num_prefill < 1 or self.num_decode < 1:
            raise ValueError(
                f"need at least one prefill and one decode instance, got "
                f"{self.num_prefill}P:{self.num_decode}D"
            )
        _check_choice("scheduler", self.scheduler, PREFILL_SCHEDULERS)
        _check_choice("rejection", self.rejection, REJECTION_POLICIES)
        _check_choice("eviction", self.eviction, EVICTION_POLICIES)
        if math.isnan(self.threshold) or self.threshold < 1.0:
            raise ValueError(f"threshold must be in [1, inf], got {self.threshold}")
        if not (self.speed > 0 and math.isfinite(self.speed)):
            raise ValueError(f"speed must be a positive number, got {self.speed}")
        if not (0.0 <= self.noise < 1.0):
            raise ValueError(f"noise must be in [0, 1), got {self.noise}")
        if self.pipeline_group < 1 or self.num_prefill % self.pipeline_group:
            raise ValueError(
                f"pipeline_group {self.pipeline_group} must divide the {self.num_prefill} "
                f"prefill instances"
            )
        for name in ("dram_capacity_blocks", "ssd_capacity_blocks", "decode_kv_capacity_tokens"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if self.prefill_chunk_tokens < 1 or self.block_size < 1:
            raise ValueError("prefill_chunk_tokens and block_size must be positive")
        if not self.series_interval_s > 0:
            raise ValueError(f"series_interval_s must be positive, got {self.series_interval_s}")
        self.policy_config()  # the policy validates its own knobs (SLOs set, t_d)

    def policy_config(self) -> PolicyConfig:
        """The PolicyConfig the live Conductor would run with these settings.

        SLOs still unset (None) stand at PolicyConfig's defaults here; `simulate` derives
        them from the profile first.
        """
        slos = {}
        if self.ttft_slo_s is not None:
            slos["ttft_slo_s"] = self.ttft_slo_s
        if self.tbt_slo_s is not None:
            slos["tbt_slo_s"] = self.tbt_slo_s
        return PolicyConfig(
            block_size=self.block_size,
            prefill_scheduler=self.scheduler,  # type: ignore[arg-type]
            kvcache_balancing_threshold=self.threshold,
            rejection_policy=self.rejection,  # type: ignore[arg-type]
            eviction_policy=self.eviction,  # type: ignore[arg-type]
            decode_time_s=self.decode_time_s,
            learn_decode_time=self.learn_decode_time,
            predicted_load_limit=self.predicted_load_limit,
            predicted_size_weight=self.predicted_size_weight,
            decode_time_window=self.decode_time_window,
            max_in_flight_requests=self.max_in_flight_requests,
            seed=self.seed,
            **slos,
        )

    @classmethod
    def of_live_policy(
        cls, policy: Mapping[str, Any], *, num_prefill: int, num_decode: int, **others: Any
    ) -> "TwinConfig":
        """The twin of a live cluster: its split and its policy configuration as the REST
        API writes it (PolicyConfig's names, the one JSON codec), SLOs included; it refits
        its cost model online as the live Conductor does (`calibrate`)."""
        config = PolicyConfig(**policy_from_json(policy))
        others.setdefault("calibrate", True)
        return cls(
            num_prefill=num_prefill,
            num_decode=num_decode,
            scheduler=config.prefill_scheduler,
            rejection=config.rejection_policy,
            threshold=config.kvcache_balancing_threshold,
            eviction=config.eviction_policy,
            ttft_slo_s=config.ttft_slo_s,
            tbt_slo_s=config.tbt_slo_s,
            decode_time_s=config.decode_time_s,
            learn_decode_time=config.learn_decode_time,
            predicted_load_limit=config.predicted_load_limit,
            predicted_size_weight=config.predicted_size_weight,
            decode_time_window=config.decode_time_window,
            max_in_flight_requests=config.max_in_flight_requests,
            seed=config.seed,
            block_size=config.block_size,
            **others,
        )

    def with_changes(self, **changes: Any) -> "TwinConfig":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, in the policy's one codec (an infinite threshold is "inf")."""
        return json_safe(asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TwinConfig":
        """Build from a dict (e.g. a JSON file); unknown keys are an error, not ignored."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown twin setting(s): {', '.join(unknown)}")
        data = dict(data)
        if "threshold" in data:
            data["threshold"] = number_from_json(data["threshold"])
        return cls(**data)

    @classmethod
    def load(cls, source: str) -> "TwinConfig":
        """From a JSON file path, or an inline JSON object string."""
        text = source
        if not source.lstrip().startswith("{"):
            path = Path(source)
            if not path.is_file():
                raise ValueError(f"config {source!r} is neither a JSON object nor a file")
            text = path.read_text()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"config {source!r} is not valid JSON: {error}") from None
        if not isinstance(data, dict):
            raise ValueError(f"config {source!r} must be a JSON object")
        return cls.from_dict(data)


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(choices)}")
