"""What agents report to the Conductor, as plain dataclasses: load, joins and heartbeats.

The wire messages are in agent.proto and backend.rpc.convert turns them into these; the
agent builds them from its parts, the Conductor (and the test harness) reads them.
"""

from dataclasses import dataclass

from backend.policy.calibration import DecodeStepSample, HostCpuSample, PrefillSample
from backend.policy.events import KvDemoted, KvEvicted, KvStored, Role

KvEvent = KvStored | KvEvicted | KvDemoted


@dataclass(frozen=True, slots=True)
class AgentLoad:
    """One agent's load right now: prefill queue, decode batch, predicted TBT, memory."""

    num_queued: int = 0
    num_running: int = 0
    queued_tokens: int = 0
    batch_size: int = 0
    context_tokens: int = 0
    predicted_tbt_s: float = 0.0  # cost model, else the last measured step
    tbt_slo_s: float = 0.0  # 0: no local check
    last_step_s: float = 0.0
    dram_bytes: int = 0
    dram_capacity_bytes: int = 0
    ssd_bytes: int = 0
    ssd_capacity_bytes: int = 0
    num_dram_blocks: int = 0
    num_ssd_blocks: int = 0
    num_pinned_keys: int = 0
    num_pending_handoffs: int = 0


@dataclass(frozen=True, slots=True)
class Join:
    now_s: float
    instance_id: str
    role: Role
    control_address: str
    data_address: str
    transport: str
    preset: str
    block_size: int
    kv_capacity_tokens: int
    dram_capacity_bytes: int
    ssd_capacity_bytes: int
    incarnation: str = ""  # new at every agent start (see agent.proto)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """`events` are numbered from `first_event_index` in the agent's life (see the proto)."""

    now_s: float
    instance_id: str
    sequence: int
    role: Role
    draining: bool
    load: AgentLoad
    events: tuple[KvEvent, ...] = ()
    first_event_index: int = 0
    num_dropped_events: int = 0
    is_final: bool = False
    # Measured since the last heartbeat, for the Conductor's calibration.
    prefill_samples: tuple[PrefillSample, ...] = ()
    decode_steps: tuple[DecodeStepSample, ...] = ()
    # Its host's CPU counters as it was sent (None where the agent cannot read them).
    host_cpu: HostCpuSample | None = None
