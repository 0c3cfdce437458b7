"""The plain, frozen records the persistence functions take and return (no ORM here).

Inputs that already exist in the policy core (RequestArrived, DispatchPrefill) are taken
as they are; these records cover what the policy does not model: outcomes with their
measured timings, agents, load samples, configuration versions and audit entries.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from backend.policy.effects import InstanceEstimate

OutcomeState = Literal["completed", "rejected", "failed", "cancelled"]
OUTCOME_STATES: tuple[str, ...] = ("completed", "rejected", "failed", "cancelled")
AgentRole = Literal["prefill", "decode"]
AGENT_ROLES: tuple[str, ...] = ("prefill", "decode")


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """How a request ended: its single terminal state and what was measured on the way.

    `reason` is required unless completed; `stage` says where it ended (e.g. "admission",
    "decode" for rejections, "prefill"/"transfer"/"decode" for failures).
    """

    state: OutcomeState
    finished_time_s: float
    reason: str | None = None
    stage: str | None = None
    message: str | None = None
    ttft_s: float | None = None
    tbt_mean_s: float | None = None
    tbt_p99_s: float | None = None
    tbt_max_s: float | None = None
    # Every inter-token gap, log-binned (backend.observe.measures.gap_histogram).
    tbt_gap_histogram: dict[int, float] | None = None
    num_generated_tokens: int | None = None
    num_reused_tokens: int | None = None
    num_transferred_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.state not in OUTCOME_STATES:
            raise ValueError(
                f"unknown outcome state {self.state!r}; choose one of {', '.join(OUTCOME_STATES)}"
            )
        if self.state != "completed" and not self.reason:
            raise ValueError(f"a {self.state} outcome needs a reason")


@dataclass(frozen=True, slots=True)
class RequestRecord:
    request_id: str
    api_key_id: str | None
    api_key_name: str | None
    arrival_time_s: float
    num_input_tokens: int
    num_output_tokens: int
    block_size: int
    block_keys: tuple[int, ...]
    ttft_slo_s: float | None
    tbt_slo_s: float | None
    outcome: RequestOutcome | None

    @property
    def num_block_keys(self) -> int:
        return len(self.block_keys)

    @property
    def is_finished(self) -> bool:
        return self.outcome is not None


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """A recorded DispatchPrefill, flattened: the cache plan as counts, plus actual TTFT."""

    decision_id: int
    request_id: str
    decided_time_s: float
    prefill_instance_id: str
    decode_instance_id: str
    num_local_blocks: int
    fetch_source_instance_id: str | None
    num_fetch_blocks: int
    num_reused_tokens: int
    num_compute_tokens: int
    estimated_queue_s: float
    estimated_transfer_s: float
    estimated_prefill_s: float
    estimated_ttft_s: float
    actual_ttft_s: float | None
    candidates: tuple[InstanceEstimate, ...]


@dataclass(frozen=True, slots=True)
class AgentRecord:
    instance_id: str
    role: AgentRole
    rpc_address: str
    data_address: str | None
    state: str
    joined_time_s: float
    left_time_s: float | None
    last_heartbeat_time_s: float | None


@dataclass(frozen=True, slots=True)
class LoadSample:
    """One instance's load at `time_s` (fields it does not have stay None)."""

    time_s: float
    instance_id: str
    prefill_load_s: float | None = None
    decode_load: float | None = None
    memory_used_bytes: int | None = None
    memory_capacity_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class ConfigVersion:
    version: int
    config: Mapping[str, Any]
    created_time_s: float
    created_by: str


@dataclass(frozen=True, slots=True)
class AuditEntry:
    entry_id: int
    time_s: float
    actor: str
    action: str
    old_value: Any
    new_value: Any
    prediction: Mapping[str, Any] | None
    config_version: int | None


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One Mooncake-format trace line (what backend.traces.loader.iter_trace reads)."""

    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "timestamp": self.timestamp_ms,
            "input_length": self.input_length,
            "output_length": self.output_length,
            "hash_ids": list(self.hash_ids),
        }
