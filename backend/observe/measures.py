"""How the live system and the twin turn samples into the same metrics (docs/fidelity.md).

One definition each, shared by the twin's report and the Conductor's live report, so their
numbers can be put side by side: percentiles (linear interpolation), token-weighted
percentiles, TBT percentiles over every inter-token gap (a log-binned gap histogram both
drivers fill), windowed means of a sampled series, and a load series' oscillation.

A TBT gap is the decode pace: live, the time between two tokens as the decode agent
produced them (each token stamped by the agent, `DecodeMessage.produced_s`), in the twin
the decode step. Not as they reached the Conductor: delivery bunches tokens (two read at
once), and at speed 12 a third of the arrival gaps were under a millisecond where no step
was under 3 ms, which put live's TBT p50 below its steps.
"""

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

# TBT gaps are counted in bins growing by 1% from 10 microseconds: a percentile read from
# the histogram is within 0.5% of the exact one, and a request's gaps fit in a small dict.
GAP_MIN_S = 1e-5
GAP_BIN_RATIO = 1.01
_LOG_RATIO = math.log(GAP_BIN_RATIO)
GapHistogram = dict[int, float]  # bin index -> number of gaps (float: the twin weights)


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


# A load series swinging less than this (p95 - p5, in units of the load at which the SLO is
# just met) is flat: its wiggles are noise, and it has no period.
MIN_OSCILLATION_AMPLITUDE = 0.05


def oscillation(series: Sequence[float], interval_s: float) -> tuple[float | None, float | None]:
    """Peak-to-trough amplitude (p95 - p5) and period (first autocorrelation peak) of a
    load series; the period is None when the series has no clear rhythm or is flat (its
    amplitude under MIN_OSCILLATION_AMPLITUDE)."""
    values = np.asarray(series, dtype=float)
    if len(values) < 4:
        return None, None
    amplitude = float(np.percentile(values, 95) - np.percentile(values, 5))
    centred = values - values.mean()
    energy = float(np.dot(centred, centred))
    if energy <= 0 or amplitude < MIN_OSCILLATION_AMPLITUDE:
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


def gap_bin(seconds: float) -> int:
    """The histogram bin of one inter-token gap."""
    return max(0, int(math.log(max(seconds, GAP_MIN_S) / GAP_MIN_S) / _LOG_RATIO))


def gap_histogram(gaps_s: Iterable[float], weights: Iterable[float] | None = None) -> GapHistogram:
    """Count gaps into bins; `weights`: how many gaps each value stands for (default 1)."""
    histogram: GapHistogram = {}
    pairs = zip(gaps_s, weights, strict=True) if weights is not None else ((g, 1) for g in gaps_s)
    for gap_s, weight in pairs:
        if weight > 0:
            index = gap_bin(gap_s)
            histogram[index] = histogram.get(index, 0) + weight
    return histogram


def merge_histograms(histograms: Iterable[Mapping[int | str, float]]) -> GapHistogram:
    """One histogram of many (keys may be strings, as JSON brings them back)."""
    merged: GapHistogram = {}
    for histogram in histograms:
        for key, count in histogram.items():
            index = int(key)
            merged[index] = merged.get(index, 0) + count
    return merged


def histogram_percentile(histogram: Mapping[int, float], q: float) -> float | None:
    """The gap at q% of all gaps: the geometric middle of the bin where the count reaches
    it. The TBT percentiles, live and in the twin."""
    total = sum(histogram.values())
    if total <= 0:
        return None
    target = total * q / 100.0
    cumulative = 0.0
    for index in sorted(histogram):
        cumulative += histogram[index]
        if cumulative >= target:
            return GAP_MIN_S * GAP_BIN_RATIO ** (index + 0.5)
    return GAP_MIN_S * GAP_BIN_RATIO ** (max(histogram) + 0.5)


# The metrics a twin prediction is held against live by (twin validate, the What-if page).
FIDELITY_METRICS = (
    "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tbt_p50_s", "tbt_p90_s",
    "num_completed", "num_rejected", "cache_hit_ratio", "goodput_rps", "slo_attainment",
    "num_replicated_blocks",
)  # fmt: skip


def relative_error(live: float | None, twin: float | None) -> float | None:
    """(twin - live) / |live|: how far the prediction is off; None when live is 0 or unknown."""
    if live is None or twin is None or live == 0:
        return None
    return (twin - live) / abs(live)
