"""MeasuredTiming: the twin's ground truth interpolated from profile points of real agents.

Piecewise-linear on purpose, not the policy's least-squares form, so a profile's curvature
shows up as policy misprediction. Points are grouped into rows (prefill: one row per cached
length, over new tokens; decode: one row per batch size, over context tokens); a query is
interpolated along the x axis inside each row, then between the two nearest rows. Beyond
the measured range the edge segments extend linearly; results are clamped at zero.
"""

import bisect
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from backend.observe.host_share import DecodeLength, HostOther
from backend.policy.cost_model import ServingFit
from twin.host import HostCores
from twin.profile_fields import (
    InstanceCapacities,
    StorageSpeeds,
    integer,
    number,
    read_capacities,
    read_link,
    read_storage,
)


class PiecewiseLinear:
    """y(x) through sorted points; repeated x values are averaged; edges extend linearly."""

    def __init__(self, points: Iterable[tuple[float, float]]) -> None:
        grouped: dict[float, list[float]] = defaultdict(list)
        for x, y in points:
            grouped[x].append(y)
        self.xs = sorted(grouped)
        self.ys = [sum(grouped[x]) / len(grouped[x]) for x in self.xs]

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if len(xs) == 1:
            return ys[0]
        index = bisect.bisect_left(xs, x)
        if index < len(xs) and xs[index] == x:
            return ys[index]
        index = min(max(index, 1), len(xs) - 1)  # the segment [index-1, index], or an edge one
        x0, x1, y0, y1 = xs[index - 1], xs[index], ys[index - 1], ys[index]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


class RowInterpolation:
    """z(row, x): a PiecewiseLinear per row, then linear between the two nearest rows."""

    def __init__(self, points: Iterable[tuple[float, float, float]]) -> None:
        rows: dict[float, list[tuple[float, float]]] = defaultdict(list)
        for row, x, z in points:
            rows[row].append((x, z))
        self.row_keys = sorted(rows)
        self.curves = [PiecewiseLinear(rows[key]) for key in self.row_keys]

    def __call__(self, row: float, x: float) -> float:
        keys = self.row_keys
        index = bisect.bisect_left(keys, row)
        if len(keys) == 1 or (index < len(keys) and keys[index] == row):
            value = self.curves[min(index, len(keys) - 1)](x)
        else:
            index = min(max(index, 1), len(keys) - 1)
            r0, r1 = keys[index - 1], keys[index]
            z0, z1 = self.curves[index - 1](x), self.curves[index](x)
            value = z0 + (z1 - z0) * (row - r0) / (r1 - r0)
        return max(value, 0.0)


@dataclass(frozen=True, slots=True)
class PrefillPoint:
    input_tokens: int
    cached_tokens: int
    seconds: float


@dataclass(frozen=True, slots=True)
class DecodePoint:
    batch_size: int
    context_tokens: int
    seconds: float


class MeasuredTiming:
    """Ground-truth durations interpolated from measured prefill and decode points."""

    def __init__(
        self,
        *,
        name: str,
        kv_bytes_per_token: int,
        link_bandwidth_bytes_per_s: float,
        link_latency_s: float,
        storage: StorageSpeeds,
        instance: InstanceCapacities,
        prefill_points: Iterable[PrefillPoint],
        decode_points: Iterable[DecodePoint],
        serving: ServingFit = ServingFit(),
        host_cores: HostCores | None = None,
    ) -> None:
        self.name = name
        self.host_cores = host_cores
        self.kv_bytes_per_token = kv_bytes_per_token
        self.link_bandwidth_bytes_per_s = link_bandwidth_bytes_per_s
        self.link_latency_s = link_latency_s
        self.storage = storage
        self.instance = instance
        self.serving = serving
        self.prefill_points = tuple(prefill_points)
        self.decode_points = tuple(decode_points)
        self._prefill = RowInterpolation(
            (*_prefill_coordinates(p.input_tokens, p.cached_tokens), p.seconds)
            for p in self.prefill_points
        )
        self._decode = RowInterpolation(
            (p.batch_size, p.context_tokens, p.seconds) for p in self.decode_points
        )

    def prefill_s(self, input_tokens: int, cached_tokens: int) -> float:
        return self._prefill(*_prefill_coordinates(input_tokens, cached_tokens))

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float:
        if batch_size <= 0:
            return 0.0
        return self._decode(batch_size, max(context_tokens, 0))

    def transfer_s(self, num_bytes: int) -> float:
        if num_bytes <= 0:
            return 0.0
        return self.link_latency_s + num_bytes / self.link_bandwidth_bytes_per_s

    def load_s(self, num_bytes: int, tier: str) -> float:
        return self.storage.load_s(num_bytes, tier)

    def decode_share(self) -> Callable[[int], float] | None:
        """Processor sharing's (twin/host.py); a profile's spread draws a measured one
        (twin/spread.py)."""
        return None

    def prefill_share(self, solo_s: float = 0.0) -> Callable[[int], float] | None:
        """Processor sharing's, as `decode_share`."""
        return None

    @property
    def measures_decode_pauses(self) -> bool:
        return False

    def decode_pause_s(self, num_busy: int) -> float | None:
        """None: the serving path's `per_token_s`; a profile's spread draws a measured
        pause (twin/spread.py)."""
        return None

    def dispatch_delay_s(self) -> float:
        return self.serving.dispatch_s

    def answer_delay_s(self) -> float:
        return self.serving.answer_s

    def first_token_delay_s(self) -> float:
        return self.serving.first_token_s

    def handover_delay_s(self) -> float:
        return self.serving.handover_s

    @classmethod
    def from_profile(cls, data: Mapping[str, Any]) -> "MeasuredTiming":
        """Build from a profile dict with `prefill_points` and `decode_points`."""
        bandwidth, latency = read_link(data)
        # An agent that did not measure its tiers is taken to read them at link speed.
        has_storage = "storage" in data
        storage = read_storage(data) if has_storage else StorageSpeeds(bandwidth, bandwidth)
        return cls(
            name=str(data.get("name", "measured")),
            kv_bytes_per_token=integer(data, "kv_bytes_per_token"),
            link_bandwidth_bytes_per_s=bandwidth,
            link_latency_s=latency,
            storage=storage,
            instance=read_capacities(data),
            serving=_serving(data),
            host_cores=_host_cores(data),
            prefill_points=[
                PrefillPoint(
                    input_tokens=integer(point, "input_tokens", where),
                    cached_tokens=integer(point, "cached_tokens", where, allow_zero=True),
                    seconds=number(point, "seconds", where),
                )
                for where, point in _points(data, "prefill_points")
            ],
            decode_points=[
                DecodePoint(
                    batch_size=integer(point, "batch_size", where),
                    context_tokens=integer(point, "context_tokens", where, allow_zero=True),
                    seconds=number(point, "seconds", where),
                )
                for where, point in _points(data, "decode_points")
            ],
        )


def _serving(data: Mapping[str, Any]) -> ServingFit:
    """The `serving` section (a profile measured on a live cluster has one), else none."""
    section = data.get("serving", {})
    if not isinstance(section, Mapping):
        raise ValueError("'serving' must be a JSON object")
    try:
        serving = ServingFit(
            **{k: number(section, k, "serving.", allow_zero=True) for k in section}
        )
    except TypeError as error:
        raise ValueError(f"'serving' has an unknown field: {error}") from None
    return serving


def _host_cores(data: Mapping[str, Any]) -> HostCores | None:
    """The `host` section's cores (a live profile of agents on one host), else None: each
    role's own where the profile holds them, else `cores` for both."""
    section = data.get("host")
    if section is None:
        return None
    if not isinstance(section, Mapping):
        raise ValueError("'host' must be a JSON object")
    cores = number(section, "cores", "host.")
    return HostCores(
        prefill=number(section, "prefill_cores", "host.") if "prefill_cores" in section else cores,
        decode=number(section, "decode_cores", "host.") if "decode_cores" in section else cores,
        decode_length=_decode_length(section.get("decode_length")),
        other=_host_other(section.get("other")),
    )


def _host_other(section: Any) -> HostOther | None:
    """`host.other`: what the rest of the host spent while the shares were measured."""
    if section is None:
        return None
    if not isinstance(section, Mapping):
        raise ValueError("'host.other' must be a JSON object")
    where = "host.other."
    cpus = number(section, "cpus", where)
    if cpus != int(cpus):
        raise ValueError(f"'{where}cpus' must be a whole number, got {cpus}")
    return HostOther(
        cpus=int(cpus),
        cores=number(section, "cores", where, allow_zero=True),
        per_prefill_s=number(section, "per_prefill_s", where, allow_zero=True),
        idle_cores=(
            number(section, "idle_cores", where, allow_zero=True)
            if "idle_cores" in section
            else 0.0
        ),
    )


def _decode_length(section: Any) -> DecodeLength | None:
    """`host.decode_length`: how a decode step's measured share falls with its length."""
    if section is None:
        return None
    if not isinstance(section, Mapping):
        raise ValueError("'host.decode_length' must be a JSON object")
    where = "host.decode_length."
    return DecodeLength(
        reference_s=number(section, "reference_s", where),
        exponent=number(section, "exponent", where, allow_zero=True),
    )


def _prefill_coordinates(input_tokens: int, cached_tokens: int) -> tuple[int, int]:
    """(row, x) = (cached tokens, new tokens); at least one token is always computed."""
    cached_tokens = min(max(cached_tokens, 0), max(input_tokens, 0))
    return cached_tokens, max(input_tokens - cached_tokens, 1)


def _points(data: Mapping[str, Any], key: str) -> list[tuple[str, Mapping[str, Any]]]:
    """(`key[i].`, point) pairs of a list of at least two point objects."""
    if key not in data:
        raise ValueError(f"lacks {key!r}")
    points = data[key]
    if not isinstance(points, list) or len(points) < 2:
        raise ValueError(f"{key!r} must be a list of at least two points")
    for i, point in enumerate(points):
        if not isinstance(point, Mapping):
            raise ValueError(f"'{key}[{i}]' must be a JSON object")
    return [(f"{key}[{i}].", point) for i, point in enumerate(points)]
