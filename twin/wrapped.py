"""WrappedTiming: a timing model that answers as the one it wraps, for wrappers (noise, a
live profile's measured spread) to override only what they change."""

from collections.abc import Callable
from typing import Any

from backend.policy.cost_model import ServingFit
from twin.host import HostCores
from twin.profile_fields import InstanceCapacities


class WrappedTiming:
    """Every property and duration of `base`, unchanged."""

    def __init__(self, base: Any) -> None:
        self.base = base

    @property
    def name(self) -> str:
        return self.base.name

    @property
    def kv_bytes_per_token(self) -> int:
        return self.base.kv_bytes_per_token

    @property
    def link_bandwidth_bytes_per_s(self) -> float:
        return self.base.link_bandwidth_bytes_per_s

    @property
    def link_latency_s(self) -> float:
        return self.base.link_latency_s

    @property
    def instance(self) -> InstanceCapacities:
        return self.base.instance

    @property
    def serving(self) -> ServingFit:
        return self.base.serving

    @property
    def host_cores(self) -> HostCores | None:
        return self.base.host_cores

    def prefill_s(self, input_tokens: int, cached_tokens: int) -> float:
        return self.base.prefill_s(input_tokens, cached_tokens)

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float:
        return self.base.decode_step_s(batch_size, context_tokens)

    def transfer_s(self, num_bytes: int) -> float:
        return self.base.transfer_s(num_bytes)

    def load_s(self, num_bytes: int, tier: str) -> float:
        return self.base.load_s(num_bytes, tier)

    def decode_share(self) -> Callable[[int], float] | None:
        return self.base.decode_share()

    def prefill_share(self, solo_s: float = 0.0) -> Callable[[int], float] | None:
        return self.base.prefill_share(solo_s)

    @property
    def measures_decode_pauses(self) -> bool:
        return self.base.measures_decode_pauses

    def decode_pause_s(self, num_busy: int) -> float | None:
        return self.base.decode_pause_s(num_busy)

    def dispatch_delay_s(self) -> float:
        return self.base.dispatch_delay_s()

    def answer_delay_s(self) -> float:
        return self.base.answer_delay_s()

    def first_token_delay_s(self) -> float:
        return self.base.first_token_delay_s()

    def handover_delay_s(self) -> float:
        return self.base.handover_delay_s()
