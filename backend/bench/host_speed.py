"""How fast the host ran each validate run's prefills, warm-up against window.

The twin predicts a window from what its warm-up measured. On the shared 2-CPU machines
this project measures on, the host's own speed moves by several per cent over minutes
(other tenants, frequency), and a window that runs slower than its warm-up is one the twin
cannot foresee. This module measures that, so a validate result says how much of a miss
the host's drift can explain.

A run's speed is its prefills' CPU seconds over what one prefill model says they should
take (the `fit_prefill` form, fitted robustly over every run's prefills of the set, so
every run is measured against the same yardstick): 1.0 is the set's typical speed, 1.10
a host 10 % slower. Each run gets it over its warm-up's prefills and over its window's;
`drift` is window over warm-up (above 1: the window's host was slower than the one the
twin was calibrated on). Only the CPU time the agents measured counts (a prefill's wall
time also holds its waits for the cores, which depend on the configuration's load).
"""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from backend.policy.cost_model import PrefillFit, fit_prefill

# Prefills each part of a run (warm-up, window) needs for its speed to be given.
MIN_PREFILLS = 20


def prefill_samples(live: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The prefills a live run's Conductor measured over warm-up and window (its
    calibration window as of the window's end); empty for runs that kept none."""
    calibration = live.get("calibration_after") or {}
    inputs = calibration.get("profile_inputs") or {}
    return list((inputs.get("window") or {}).get("prefill") or [])


def host_speeds(
    runs: Sequence[tuple[Sequence[Mapping[str, Any]], float]],
) -> list[dict[str, float] | None]:
    """Each run's {"warmup", "window", "drift"} (see the module doc) from `(prefills,
    window_start_s)` pairs, prefills as the calibration keeps them (`input_tokens`,
    `cached_tokens`, `seconds`, `cpu_s`, `time_s`). None for a run without MIN_PREFILLS
    prefills with their CPU time on either side of its window's start; every run None when
    the set has too few for the fit."""
    measured = [[_point(s) for s in samples if s.get("cpu_s")] for samples, _ in runs]
    points = [point for run in measured for point in run]
    if len(points) < MIN_PREFILLS:
        return [None] * len(runs)
    fit = fit_prefill([(i, c, t) for i, c, t, _ in points], robust=True)
    speeds: list[dict[str, float] | None] = []
    for run, (_, window_start_s) in zip(measured, runs, strict=True):
        warmup = [p for p in run if p[3] < window_start_s]
        window = [p for p in run if p[3] >= window_start_s]
        if len(warmup) < MIN_PREFILLS or len(window) < MIN_PREFILLS:
            speeds.append(None)
            continue
        before, after = _speed(fit, warmup), _speed(fit, window)
        speeds.append(
            {
                "warmup": round(before, 4),
                "window": round(after, 4),
                "drift": round(after / before, 4),
            }
        )
    return speeds


def relative_speeds(runs: Sequence[Sequence[Mapping[str, Any]]]) -> list[float | None]:
    """Each run's speed (as `host_speeds`, against one yardstick fitted over every run's
    prefills) from its prefills alone; None for a run with fewer than MIN_PREFILLS
    clocked prefills, every run None when the set has too few for the fit."""
    measured = [[_point(s) for s in samples if s.get("cpu_s")] for samples in runs]
    points = [point for run in measured for point in run]
    if len(points) < MIN_PREFILLS:
        return [None] * len(runs)
    fit = fit_prefill([(i, c, t) for i, c, t, _ in points], robust=True)
    return [_speed(fit, run) if len(run) >= MIN_PREFILLS else None for run in measured]


def summary(speeds: Sequence[dict[str, float] | None]) -> dict[str, Any] | None:
    """One config's runs: the medians of their warm-up and window speeds and drifts, and
    every run's (None where a run had none)."""
    known = [s for s in speeds if s is not None]
    if not known:
        return None
    return {
        **{key: round(float(np.median([s[key] for s in known])), 4) for key in known[0]},
        "runs": list(speeds),
    }


def _point(sample: Mapping[str, Any]) -> tuple[int, int, float, float]:
    # The CPU clock can read a little over the wall clock; the computation took no longer.
    seconds = min(float(sample["cpu_s"]), float(sample["seconds"]))
    return (
        int(sample["input_tokens"]),
        int(sample["cached_tokens"]),
        seconds,
        float(sample["time_s"]),
    )


def _speed(fit: PrefillFit, points: Sequence[tuple[int, int, float, float]]) -> float:
    modelled = sum(fit.time_s(i, c) for i, c, _, _ in points)
    return sum(t for _, _, t, _ in points) / modelled
