"""Decisions the ConductorCore returns; drivers carry them out (gRPC, SimPy, or a benchmark).

All frozen dataclasses. Drivers carry them out through one contract, `EffectHandler` and
`carry_out`: a new effect added to `Effect` must be handled by every driver, or it fails
the type check (`assert_never`) and the driver cannot be constructed (abstract method).
Rejections and failures are terminal: each accepted request ends in exactly one of
DecodeFinished (completed), DecodeRejected / Reject (rejected) or FailRequest.
"""

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, assert_never

from backend.policy.cost_model import DecodeFit

RejectionStage = Literal["admission", "decode"]


@dataclass(frozen=True, slots=True)
class FetchSpan:
    """Blocks to fetch from another instance's shard, in prefix order."""

    source_instance_id: str
    keys: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CachePlan:
    """How a prefill reuses the pool: load `local_keys` from its own shard, then `fetch`.

    The prefill computes the remaining `num_compute_tokens` tokens.
    """

    local_keys: tuple[int, ...]
    fetch: FetchSpan | None
    num_reused_tokens: int
    num_compute_tokens: int


class InstanceEstimate(NamedTuple):
    """What Algorithm 1 predicted for one prefill instance (kept for explanations).

    A NamedTuple rather than a frozen dataclass: one is built per instance per decision,
    and a tuple is built many times faster; it is just as immutable.
    """

    instance_id: str
    prefix_blocks: int
    queue_s: float
    transfer_s: float
    prefill_s: float
    ttft_s: float
    uses_transfer: bool


@dataclass(frozen=True, slots=True)
class DispatchPrefill:
    """Run this request's prefill on `instance_id` following `plan`.

    `decode_instance_id` is the decode instance chosen now; DispatchDecode confirms it.
    """

    request_id: str
    instance_id: str
    decode_instance_id: str
    plan: CachePlan
    estimated_queue_s: float
    estimated_transfer_s: float
    estimated_prefill_s: float
    estimated_ttft_s: float
    candidates: tuple[InstanceEstimate, ...]


@dataclass(frozen=True, slots=True)
class Replicate:
    """Keep a copy of `keys` from `source_instance_id` in `target_instance_id`'s shard.

    Emitted with a DispatchPrefill whose plan fetches these keys: the fetch brings them in,
    this tells the target to keep them (hot-spot migration).
    """

    request_id: str
    source_instance_id: str
    target_instance_id: str
    keys: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ArrivalCheck:
    """The check the decode instance runs when the request reaches it (late rejection): the
    request's TBT SLO and the decode-step model believed when it was dispatched. It travels
    with the dispatch, so the configuration in force is the one every driver applies."""

    tbt_slo_s: float
    decode: DecodeFit


@dataclass(frozen=True, slots=True)
class DispatchDecode:
    """Hand the request's KV to `instance_id` for decoding; `arrival_check` None: admit it
    without a check (rejection policy "none")."""

    request_id: str
    instance_id: str
    num_context_tokens: int
    arrival_check: ArrivalCheck | None = None


@dataclass(frozen=True, slots=True)
class Reject:
    """Refuse the request (terminal). Admission rejections answer HTTP 429."""

    request_id: str
    reason: str
    stage: RejectionStage
    message: str
    retry_after_s: float


@dataclass(frozen=True, slots=True)
class FailRequest:
    """End an accepted request as failed (terminal), e.g. its instance died mid-flight."""

    request_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Evict:
    """Drop `keys` from `instance_id`'s shard."""

    instance_id: str
    keys: tuple[int, ...]


Effect = DispatchPrefill | Replicate | DispatchDecode | Reject | FailRequest | Evict


class EffectHandler(ABC):
    """What a driver (the live runtime, the twin, a benchmark) does with each effect."""

    @abstractmethod
    def on_dispatch_prefill(self, effect: DispatchPrefill, *, replicate: bool) -> None:
        """`replicate`: a Replicate of the same request came with it (keep the fetched
        blocks); it is also handed to `on_replicate`."""

    @abstractmethod
    def on_replicate(self, effect: Replicate) -> None: ...

    @abstractmethod
    def on_dispatch_decode(self, effect: DispatchDecode) -> None: ...

    @abstractmethod
    def on_reject(self, effect: Reject) -> None: ...

    @abstractmethod
    def on_fail(self, effect: FailRequest) -> None: ...

    @abstractmethod
    def on_evict(self, effect: Evict) -> None: ...


def carry_out(handler: EffectHandler, effects: Sequence[Effect]) -> None:
    """Hand every effect, in order, to the handler's method for its kind."""
    replicated = {e.request_id for e in effects if type(e) is Replicate}
    for effect in effects:
        match effect:
            case DispatchPrefill():
                handler.on_dispatch_prefill(effect, replicate=effect.request_id in replicated)
            case Replicate():
                handler.on_replicate(effect)
            case DispatchDecode():
                handler.on_dispatch_decode(effect)
            case Reject():
                handler.on_reject(effect)
            case FailRequest():
                handler.on_fail(effect)
            case Evict():
                handler.on_evict(effect)
            case _:
                assert_never(effect)
