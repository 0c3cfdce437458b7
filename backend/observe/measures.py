"""How the live system and the twin turn samples into DESIGN.md's metrics.

One definition each, shared by the twin's report and the Conductor's live report, so their
numbers can be put side by side: percentiles (linear interpolation), token-weighted
percentiles (TBT), windowed means of a sampled series, and a load series' oscillation.
"""

from collections.abc import Sequence

import numpy as np


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float | None:
    """The smallest value whose cumulative weight reaches q% of the total weight."""
    if not len(values) or weights.sum() <= 0:
        return None
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order])
    index = int(np.searchsorted(cumulative, cumulative[-1] * q / 100.0))
    return float(values[order][min(index, len(values) - 1)])


def oscillation(series: Sequence[float], interval_s: float) -> tuple[float | None, float | None]:
    """Peak-to-trough amplitude (p95 - p5) and period (first autocorrelation peak) of a
    load series; the period is None when the series has no clear rhythm."""
    values = np.asarray(series, dtype=float)
    if len(values) < 4:
        return None, None
    amplitude = float(np.percentile(values, 95) - np.percentile(values, 5))
    centred = values - values.mean()
    energy = float(np.dot(centred, centred))
    if energy <= 0:
        return amplitude, None
    max_lag = len(values) // 2
    correlation = [
        float(np.dot(centred[:-lag], centred[lag:])) / energy for lag in range(1, max_lag)
    ]
    for lag in range(2, len(correlation)):
        before, here, after = correlation[lag - 2], correlation[lag - 1], correlation[lag]
        if here > 0.3 and here >= before and here >= after:
            return amplitude, lag * interval_s
    return amplitude, None


def window_means(t_s: Sequence[float], samples: Sequence[float], edges: np.ndarray) -> list:
    index = np.searchsorted(edges, np.asarray(t_s), side="right") - 1
    sums = np.bincount(index, weights=np.asarray(samples), minlength=len(edges) - 1)
    counts = np.bincount(index, minlength=len(edges) - 1)
    return [
        float(s / c) if c else 0.0 for s, c in zip(sums[: len(edges) - 1], counts, strict=False)
    ]
