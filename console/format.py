"""How the console writes numbers: one function per kind of quantity, so a page and its tests
write the backend's figures the same way. None (undefined, e.g. no completed request) is "n/a"."""

import math
from datetime import UTC, datetime

NONE = "n/a"


def count(value: float | None) -> str:
    return NONE if value is None else f"{round(value):,}"


def seconds(value: float | None) -> str:
    """Below a second in milliseconds, else seconds."""
    if value is None:
        return NONE
    if math.isinf(value):
        return "∞"
    if abs(value) < 1.0:
        return f"{value * 1e3:.1f} ms"
    return f"{value:.2f} s"


def ratio(value: float | None) -> str:
    return NONE if value is None else f"{value * 100:.1f} %"


def rate(value: float | None) -> str:
    return NONE if value is None else f"{value:.2f} req/s"


def load(value: float | None) -> str:
    """A pool load (predicted / SLO); 1.00 is at the SLO."""
    return NONE if value is None else f"{value:.2f}"


def number(value: float | None) -> str:
    if value is None:
        return NONE
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    return f"{value:,.4g}" if isinstance(value, float) else f"{value:,}"


def data_size(value_bytes: float | None) -> str:
    """Bytes in B, KiB, MiB or GiB (binary units, one decimal)."""
    if value_bytes is None:
        return NONE
    if abs(value_bytes) < 1024:
        return f"{value_bytes:.0f} B"
    value = value_bytes / 1024
    for unit in ("KiB", "MiB"):
        if abs(value) < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def clock(epoch_s: float | None) -> str:
    """An epoch time as UTC date and time to the second."""
    if epoch_s is None:
        return NONE
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def metric(name: str, value: float | None) -> str:
    """A report metric by its name's unit: *_s seconds, *_ratio / slo_attainment ratios,
    *_rps rates, num_* and *_tokens counts, load amplitudes as loads."""
    if isinstance(value, bool) or (value is not None and not isinstance(value, int | float)):
        return str(value)
    if name.endswith("_s"):
        return seconds(value)
    if name.endswith("_ratio") or name == "slo_attainment":
        return ratio(value)
    if name.endswith("_rps"):
        return rate(value)
    if name.endswith("_amplitude"):
        return load(value)
    if name.startswith("num_") or name.endswith(("_tokens", "_blocks")):
        return count(value)
    return number(value)
