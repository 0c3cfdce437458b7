"""The twin's timing model: the ground truth it executes, separate from the policy's beliefs.

Beliefs and ground truth are kept apart on purpose: the policy predicts with
`backend.policy.CostModel`; the twin executes with a `TimingModel` (analytic
`RooflineTiming`, interpolated `MeasuredTiming`, optionally wrapped in `NoisyTiming`).
`policy_cost_model` derives the policy's beliefs from a timing model the way a deployment
would: by profiling it and fitting the policy's form, so the policy's mispredictions in the
twin are those of a real deployment.
"""

import random
from collections.abc import Callable
from typing import Any, Protocol

from backend.policy import CostModel, LinkModel
from backend.policy.cost_model import PROFILE_FORMAT, ServingFit, fit_decode, fit_prefill
from backend.settings.profiles import read_profile
from twin.host import HostCores
from twin.measured import MeasuredTiming
from twin.profile_fields import InstanceCapacities
from twin.roofline import RooflineTiming
from twin.spread import MeasuredSpread, read_spread
from twin.wrapped import WrappedTiming


class TimingModel(Protocol):
    """How long work takes on one kind of instance; every duration in seconds."""

    @property
    def name(self) -> str: ...
    @property
    def kv_bytes_per_token(self) -> int: ...
    @property
    def link_bandwidth_bytes_per_s(self) -> float: ...
    @property
    def link_latency_s(self) -> float: ...
    @property
    def instance(self) -> InstanceCapacities: ...
    @property
    def serving(self) -> ServingFit:
        """The serving path's own costs: dispatch, first-token delivery, per-token streaming."""
        ...

    @property
    def host_cores(self) -> HostCores | None:
        """Cores the instances share on one host (twin/host.py); None: each has its own."""
        ...

    def prefill_s(self, input_tokens: int, cached_tokens: int) -> float:
        """Compute time of a prompt whose first cached_tokens reuse KV (>= 1 token computed)."""
        ...

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float:
        """One continuous-batching iteration over a batch holding context_tokens of KV."""
        ...

    def transfer_s(self, num_bytes: int) -> float:
        """Latency plus bytes over one link, without queueing (the twin queues transfers)."""
        ...

    def load_s(self, num_bytes: int, tier: str) -> float:
        """Reading reused KV from the instance's "dram" or "ssd" tier into its GPUs."""
        ...

    def decode_share(self) -> Callable[[int], float] | None:
        """On a shared host, a decode batch's share of a core by the number of agents
        computing, its place in a live profile's measured spread drawn once per stretch of
        constant batch; None: processor sharing's."""
        ...

    def prefill_share(self, solo_s: float = 0.0) -> Callable[[int], float] | None:
        """On a shared host, one prefill's share of a core by the number of agents
        computing, its place in a live profile's measured spread drawn once per prefill
        (of `solo_s` seconds alone: its length class's where the profile has classes);
        None: processor sharing's."""
        ...

    @property
    def measures_decode_pauses(self) -> bool:
        """Whether `decode_pause_s` draws measured pauses (asked without drawing one)."""
        ...

    def decode_pause_s(self, num_busy: int) -> float | None:
        """On a shared host, the decode loop's pause between two steps of a batch (handing
        out the tokens, taking in requests) while `num_busy` other agents compute, drawn
        from a live profile's measured spread; None: no pause of its own (the serving
        path's `per_token_s` is added to each step instead)."""
        ...

    def dispatch_delay_s(self) -> float:
        """One request's way from arrival to its prefill agent (the serving path's)."""
        ...

    def answer_delay_s(self) -> float:
        """One prefill's answer on its way back to the Conductor (the serving path's; the
        core sees the prefill end when it arrives)."""
        ...

    def first_token_delay_s(self) -> float:
        """One request's way from its prefill's answer to its first token leaving."""
        ...

    def handover_delay_s(self) -> float:
        """A prefill agent's worker going from one prefill to the next one waiting (the
        line's hand-over, a live profile measures it)."""
        ...


class NoisyTiming(WrappedTiming):
    """A timing model whose every nonzero duration is scaled by max(0.05, 1 + N(0, std))."""

    def __init__(self, base: TimingModel, relative_std: float, seed: int) -> None:
        if not 0.0 <= relative_std < 1.0:
            raise ValueError(f"relative_std must be in [0, 1), got {relative_std}")
        super().__init__(base)
        self.relative_std = relative_std
        self._random = random.Random(seed)

    @property
    def name(self) -> str:
        return f"{self.base.name}+noise{self.relative_std:g}"

    def _noisy(self, seconds: float) -> float:
        if self.relative_std == 0.0 or seconds == 0.0:
            return seconds
        return seconds * max(0.05, 1.0 + self._random.gauss(0.0, self.relative_std))

    def prefill_s(self, input_tokens: int, cached_tokens: int) -> float:
        return self._noisy(self.base.prefill_s(input_tokens, cached_tokens))

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float:
        return self._noisy(self.base.decode_step_s(batch_size, context_tokens))

    def transfer_s(self, num_bytes: int) -> float:
        return self._noisy(self.base.transfer_s(num_bytes))

    def load_s(self, num_bytes: int, tier: str) -> float:
        return self._noisy(self.base.load_s(num_bytes, tier))


def load_timing(profile: str, *, noise: float = 0.0, seed: int = 0) -> TimingModel:
    """A built-in profile by name ("paper") or a profile JSON file; ValueError in one line."""
    data, where = read_profile(profile)
    try:
        timing = timing_from_profile(data)
        spreads = read_spread(data)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    if spreads:  # a live profile: durations vary as they did live
        timing = MeasuredSpread(timing, spreads, seed)
    if noise == 0.0:
        return timing
    return NoisyTiming(timing, noise, seed)


def timing_from_profile(data: Any) -> TimingModel:
    """RooflineTiming for a profile with a `roofline` section, MeasuredTiming for points."""
    if not isinstance(data, dict):
        raise ValueError("must be a JSON object")
    if data.get("format", PROFILE_FORMAT) != PROFILE_FORMAT:
        raise ValueError(f"has format {data['format']!r}, expected {PROFILE_FORMAT!r}")
    if "roofline" in data:
        return RooflineTiming.from_profile(data)
    if "prefill_points" in data or "decode_points" in data:
        return MeasuredTiming.from_profile(data)
    raise ValueError("has neither a 'roofline' section nor 'prefill_points'/'decode_points'")


# The profiling grid: the trace's range (prompts up to 128k tokens, batches up to 128).
PROFILE_INPUT_TOKENS = (256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
PROFILE_CACHED_FRACTIONS = (0.0, 0.25, 0.5, 0.75, 0.9)
PROFILE_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
PROFILE_CONTEXT_PER_REQUEST_TOKENS = (1024, 4096, 8192, 16384, 32768)


def policy_cost_model(timing: TimingModel, *, block_size: int = 512) -> CostModel:
    """What the policy believes: the policy's form fitted to a profiling sweep of `timing`.

    Cached prefixes are whole blocks, as in the KV pool; decode points beyond the instance's
    KV capacity are skipped, as a real profiler could not run them. Noise is stripped first:
    a deployment profiles with repeated runs and keeps the mean.
    """
    while isinstance(timing, NoisyTiming | MeasuredSpread):
        timing = timing.base
    if block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")
    prefill_points = {
        (inputs, cached)
        for inputs in PROFILE_INPUT_TOKENS
        for fraction in PROFILE_CACHED_FRACTIONS
        for cached in [int(inputs * fraction) // block_size * block_size]
    }
    capacity_tokens = timing.instance.decode_kv_capacity_tokens or float("inf")
    decode_points = [
        (batch, batch * per_request)
        for batch in PROFILE_BATCH_SIZES
        for per_request in PROFILE_CONTEXT_PER_REQUEST_TOKENS
    ]
    feasible = [point for point in decode_points if point[1] <= capacity_tokens]
    if len(feasible) >= 3:
        decode_points = feasible
    return CostModel(
        prefill=fit_prefill(
            (inputs, cached, timing.prefill_s(inputs, cached))
            for inputs, cached in sorted(prefill_points)
        ),
        decode=fit_decode(
            (batch, context, timing.decode_step_s(batch, context))
            for batch, context in decode_points
        ),
        link=LinkModel(
            bandwidth_bytes_per_s=timing.link_bandwidth_bytes_per_s,
            latency_s=timing.link_latency_s,
        ),
        kv_bytes_per_token=timing.kv_bytes_per_token,
        name=f"fit-of-{timing.name}",
        serving=timing.serving,
    )


def believed_from_profile(profile: str, block_size: int) -> CostModel:
    """What the policy believes in a run on `profile`, by the same function the Conductor
    and the agents use (`CostModel.from_profile`): a live profile's `believed` section (the
    Conductor's calibrated model), or the fit of a measured profile's points. Only an
    analytic (roofline) profile, which no Conductor starts from, gets the policy's form
    fitted to a profiling sweep of its timing (`policy_cost_model`)."""
    data, where = read_profile(profile)
    if isinstance(data, dict) and "believed" in data:
        try:
            return CostModel.from_profile(data["believed"])
        except ValueError as error:
            raise ValueError(f"{where}: 'believed': {error}") from None
    if isinstance(data, dict) and "roofline" not in data:
        try:
            return CostModel.from_profile(data)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
    return policy_cost_model(load_timing(profile), block_size=block_size)
