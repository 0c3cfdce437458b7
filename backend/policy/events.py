"""Events the drivers (live Conductor, twin, benchmarks) feed into the ConductorCore.

Each is a frozen dataclass carrying `now_s`, the driver's clock at the moment it happened;
the core never reads a clock of its own.
"""

from dataclasses import dataclass
from typing import Literal

from backend.policy.index import Tier

Role = Literal["prefill", "decode"]


@dataclass(frozen=True, slots=True)
class RequestArrived:
    """A client request reached the Conductor.

    `block_keys` are the chained keys of the prompt's full blocks. `num_output_tokens` is
    the client's max_tokens (what decode will at most generate). SLO fields override the
    configured SLOs for this request when set.
    """

    now_s: float
    request_id: str
    block_keys: tuple[int, ...]
    num_input_tokens: int
    num_output_tokens: int
    ttft_slo_s: float | None = None
    tbt_slo_s: float | None = None


@dataclass(frozen=True, slots=True)
class PrefillStarted:
    now_s: float
    request_id: str
    instance_id: str


@dataclass(frozen=True, slots=True)
class PrefillFinished:
    now_s: float
    request_id: str
    instance_id: str
    # The seconds the instance worked on this prefill, as it measured them (loading cached
    # blocks, compute, storing, the KV hand-off; not its wait in line, not the calls to and
    # from it), for the instance's pace. None: from its PrefillStarted to now.
    took_s: float | None = None


@dataclass(frozen=True, slots=True)
class DecodeStarted:
    now_s: float
    request_id: str
    instance_id: str


@dataclass(frozen=True, slots=True)
class DecodeStep:
    """A decoding request has generated `num_generated_tokens` tokens so far."""

    now_s: float
    request_id: str
    num_generated_tokens: int


@dataclass(frozen=True, slots=True)
class DecodeFinished:
    """The request's last token; `num_generated_tokens` (when the driver counts them) teaches
    early-predicted how much of max_tokens requests really use."""

    now_s: float
    request_id: str
    num_generated_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class DecodeRejected:
    """The decode instance's local check refused the request on arrival (late rejection)."""

    now_s: float
    request_id: str
    instance_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class RequestFailed:
    """The driver lost a request it had dispatched (an RPC error, a broken stream): forget
    it wherever it stands, freeing its place in the prefill queue and the decode batch."""

    now_s: float
    request_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class RequestCancelled:
    """Nobody waits for the request any more (its client went away, it hit its deadline or a
    stop sequence): forget it wherever it stands, as for a failure; the driver has told the
    agents holding it to drop it."""

    now_s: float
    request_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class RequestRetried:
    """The request's dispatch broke on the way for a reason of the cluster, not of the request
    (its KV could not reach its decode instance, which had died unnoticed): place it again
    from the start, on the instances there are now, without a second admission."""

    now_s: float
    request_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class KvStored:
    now_s: float
    instance_id: str
    keys: tuple[int, ...]
    tier: Tier = Tier.DRAM


@dataclass(frozen=True, slots=True)
class KvEvicted:
    now_s: float
    instance_id: str
    keys: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class KvDemoted:
    """Blocks moved from an instance's DRAM tier to its SSD tier."""

    now_s: float
    instance_id: str
    keys: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class KvLost:
    """The instance lost track of its KV events (its backlog overflowed): the index no longer
    knows what it holds, so forget all its blocks; it re-learns them as they are stored."""

    now_s: float
    instance_id: str


@dataclass(frozen=True, slots=True)
class AgentJoined:
    """An instance is ready to serve. `kv_capacity_tokens` bounds a decode instance's batch."""

    now_s: float
    instance_id: str
    role: Role
    kv_capacity_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class AgentDraining:
    """An instance takes no new work (before a role switch or a stop); what it already has
    runs to the end. A later AgentJoined (new role) or AgentLeft ends the drain."""

    now_s: float
    instance_id: str


@dataclass(frozen=True, slots=True)
class AgentLeft:
    """An instance is gone (drained, switched role or missed its heartbeats)."""

    now_s: float
    instance_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class TransferMeasured:
    """A fetch of KV blocks ended: `num_bytes` from `source_instance_id`'s shard reached
    `destination_instance_id` in `seconds` (the fetch alone, measured where it ran)."""

    now_s: float
    source_instance_id: str
    destination_instance_id: str
    num_bytes: int
    seconds: float


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed with nothing else happening."""

    now_s: float


Event = (
    RequestArrived
    | PrefillStarted
    | PrefillFinished
    | DecodeStarted
    | DecodeStep
    | DecodeFinished
    | DecodeRejected
    | RequestFailed
    | RequestCancelled
    | RequestRetried
    | KvStored
    | KvEvicted
    | KvDemoted
    | KvLost
    | AgentJoined
    | AgentDraining
    | AgentLeft
    | TransferMeasured
    | Tick
)
