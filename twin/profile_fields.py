"""The parts every timing profile shares: instance capacities, storage speeds, checked fields.

Readers raise ValueError naming the offending field (e.g. `link.latency_s`);
`twin.timing.load_timing` prefixes the file, so every profile error is one line.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class InstanceCapacities:
    """What one instance holds: the twin's defaults when its config leaves them None."""

    dram_capacity_bytes: int
    ssd_capacity_bytes: int
    decode_kv_capacity_tokens: int


@dataclass(frozen=True, slots=True)
class StorageSpeeds:
    """How fast reused KV is read from an instance's own pool tiers into its GPUs."""

    dram_read_bytes_per_s: float
    ssd_read_bytes_per_s: float

    def load_s(self, num_bytes: int, tier: str) -> float:
        if tier == "dram":
            bandwidth = self.dram_read_bytes_per_s
        elif tier == "ssd":
            bandwidth = self.ssd_read_bytes_per_s
        else:
            raise ValueError(f"unknown KV tier {tier!r}; choose dram or ssd")
        return max(num_bytes, 0) / bandwidth


def section(data: Mapping[str, Any], key: str, where: str = "") -> Mapping[str, Any]:
    """The sub-object `key` of `data`; an error when it is absent or not an object."""
    name = f"{where}{key}"
    if key not in data:
        raise ValueError(f"lacks {name!r}")
    value = data[key]
    if not isinstance(value, Mapping):
        raise ValueError(f"{name!r} must be a JSON object")
    return value


def number(
    data: Mapping[str, Any], key: str, where: str = "", *, allow_zero: bool = False
) -> float:
    """A finite number that must be positive (or >= 0 with allow_zero)."""
    name = f"{where}{key}"
    if key not in data:
        raise ValueError(f"lacks {name!r}")
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name!r} must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        bound = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{name!r} must be {bound}, got {value!r}")
    return float(value)


def integer(data: Mapping[str, Any], key: str, where: str = "", *, allow_zero: bool = False) -> int:
    """A whole positive (or >= 0 with allow_zero) number; 1e12 is accepted, 1.5 is not."""
    value = number(data, key, where, allow_zero=allow_zero)
    if value != int(value):
        raise ValueError(f"{f'{where}{key}'!r} must be a whole number, got {value!r}")
    return int(value)


def read_capacities(data: Mapping[str, Any]) -> InstanceCapacities:
    """The `instance` section, all three capacities given."""
    instance = section(data, "instance")
    return InstanceCapacities(
        **{
            name: integer(instance, name, "instance.", allow_zero=True)
            for name in ("dram_capacity_bytes", "ssd_capacity_bytes", "decode_kv_capacity_tokens")
        }
    )


def read_storage(data: Mapping[str, Any]) -> StorageSpeeds:
    """The `storage` section."""
    storage = section(data, "storage")
    return StorageSpeeds(
        dram_read_bytes_per_s=number(storage, "dram_read_bytes_per_s", "storage."),
        ssd_read_bytes_per_s=number(storage, "ssd_read_bytes_per_s", "storage."),
    )


def read_link(data: Mapping[str, Any]) -> tuple[float, float]:
    """(bandwidth_bytes_per_s, latency_s) of the `link` section."""
    link = section(data, "link")
    return (
        number(link, "bandwidth_bytes_per_s", "link."),
        number(link, "latency_s", "link.", allow_zero=True),
    )
