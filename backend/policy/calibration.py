"""Calibration: the cost model refitted online from what the live agents measured.

Owns the rolling window of measurements (every prefill, every decode step, every request's
serving-path costs) and the rules of a refit: never from too few points, robust to outliers,
a bounded change per refit. Pure like the rest of the policy: times arrive as `time_s` and
`now_s`; the runtime feeds it, applies the new model and logs the verdicts.
"""

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from backend.policy.cost_model import (
    CostModel,
    DecodeFit,
    PrefillFit,
    ServingFit,
    fit_decode,
    fit_prefill,
)


@dataclass(frozen=True, slots=True)
class PrefillSample:
    """One prefill as its agent measured it. `seconds` is the agent's occupancy: from taking
    its prefill worker to letting it go (loads, fetch, compute, stores, KV hand-off), which is
    what requests queued behind it wait for. `cpu_s`: the CPU time its thread got in those
    seconds, about what it would take alone on the host (None where not measured).
    `fetch_s`: of `seconds`, those spent fetching the `fetched_tokens` from another
    instance (what the live profile's link is fitted from). `handover_s`: where it waited
    behind another prefill, from that one letting the worker go to this one holding it
    (agents/node/line.py), time neither prefill's `seconds` holds; None where it found the
    worker free or the agent does not measure it."""

    time_s: float
    input_tokens: int
    cached_tokens: int
    seconds: float
    queue_s: float = 0.0
    fetched_tokens: int = 0
    cpu_s: float | None = None
    fetch_s: float = 0.0
    handover_s: float | None = None

    def is_sound(self) -> bool:
        """Whether it can be a measurement at all (finite, non-negative, cached and fetched
        tokens within the input): the calibration takes nothing else."""
        return (
            _finite(self.time_s)
            and 0 <= self.cached_tokens <= self.input_tokens
            and 0 <= self.fetched_tokens <= self.input_tokens
            and _non_negative(self.seconds, self.queue_s, self.fetch_s)
            and _non_negative_or_none(self.cpu_s, self.handover_s)
        )


@dataclass(frozen=True, slots=True)
class DecodeStepSample:
    """One continuous-batching iteration: batch size, KV tokens of the batch, seconds, the
    CPU time the decode loop's thread got in them, and the loop's pause before it: from the
    previous step's end while the batch held requests (handing out tokens, taking in
    requests); None where not measured or where the loop waited for work first."""

    time_s: float
    batch_size: int
    context_tokens: int
    seconds: float
    cpu_s: float | None = None
    pause_s: float | None = None

    def is_sound(self) -> bool:
        """Whether it can be a measurement at all (see `PrefillSample.is_sound`)."""
        return (
            _finite(self.time_s)
            and self.batch_size >= 1
            and self.context_tokens >= 0
            and _non_negative(self.seconds)
            and _non_negative_or_none(self.cpu_s, self.pause_s)
        )


@dataclass(frozen=True, slots=True)
class ServingSample:
    """One completed request's serving-path costs, measured by the Conductor.

    `dispatch_s`: arrival to the prefill agent taking the call; `answer_s`: the agent's
    answer on its way back to the Conductor (None where the agent does not stamp its
    answer: `dispatch_s` then holds both ways, arrival to the answer minus the agent's own
    time); `first_token_s`: the agent's answer to the first token leaving the Conductor;
    `tbt_mean_s` over `num_gaps` streamed gaps (per-token streaming is what it adds to the
    agents' step times)."""

    time_s: float
    dispatch_s: float
    first_token_s: float
    tbt_mean_s: float | None = None
    num_gaps: int = 0
    answer_s: float | None = None


@dataclass(frozen=True, slots=True)
class HostCpuSample:
    """The CPU counters of an agent's host as its heartbeat was sent (cumulative since the
    host booted, over its `cpus`): the window's first and last of one host give how much
    CPU it spent busy in between, the agents' compute threads and everything else
    (backend/observe/host_share.py: `host_other`)."""

    time_s: float
    host_id: str
    cpus: int
    busy_s: float
    total_s: float

    def is_sound(self) -> bool:
        """A named host with CPUs, and no more busy time than time."""
        return (
            _finite(self.time_s)
            and bool(self.host_id)
            and self.cpus > 0
            and _non_negative(self.busy_s, self.total_s)
            and self.busy_s <= self.total_s
        )


def _finite(value: float) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _non_negative(*values: float) -> bool:
    return all(_finite(v) and v >= 0 for v in values)


def _non_negative_or_none(*values: float | None) -> bool:
    return all(v is None or _non_negative(v) for v in values)


@dataclass(frozen=True, slots=True)
class CalibrationConfig:
    """When a refit may happen and how far it may move the model."""

    window_s: float = 600.0
    max_samples: int = 4096  # per kind; the oldest go first
    min_prefill_points: int = 20
    min_decode_points: int = 50
    min_serving_points: int = 10
    # A refit moves the median prediction over the window by at most this factor.
    max_change_factor: float = 2.0
    refit_interval_s: float = 10.0
    # A part is refitted as soon as its points in the window have grown by this factor since
    # its last fit, interval or not: a first fit from 20 prefills is a rough one (at speed 8
    # it was believed over the rest of a 7.5-s warm-up, a 2,000-token prefill's believed time
    # anywhere from 0.38 to 0.94 s over five runs), and refitting as the points double
    # settles it within a few seconds of a start.
    refit_growth: float = 2.0

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "CalibrationConfig":
        """The settings as `asdict` saved them (a kept run's `profile_inputs`); a setting
        added since takes its default, one since removed is ignored."""
        known = {name for name in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    def __post_init__(self) -> None:
        if not (self.window_s > 0 and self.refit_interval_s >= 0 and self.max_samples > 0):
            raise ValueError("window_s, max_samples must be positive, refit_interval_s >= 0")
        if not self.max_change_factor > 1.0:
            raise ValueError(f"max_change_factor must exceed 1, got {self.max_change_factor}")
        if not self.refit_growth > 1.0:
            raise ValueError(f"refit_growth must exceed 1, got {self.refit_growth}")
        for name in ("min_prefill_points", "min_decode_points", "min_serving_points"):
            if getattr(self, name) < 3:
                raise ValueError(f"{name} must be at least 3 (a fit has three terms)")


@dataclass(frozen=True, slots=True)
class Refit:
    """What a refit did: the model now believed, the parts it updated, and why others stayed."""

    cost: CostModel
    updated: tuple[str, ...]
    notes: tuple[str, ...]


class Calibrator:
    """The rolling window and the model fitted from it; see the module docstring."""

    def __init__(self, base: CostModel, config: CalibrationConfig = CalibrationConfig()) -> None:
        self.base = base
        self.cost = base
        self.config = config
        self.prefill: deque[PrefillSample] = deque(maxlen=config.max_samples)
        self.decode: deque[DecodeStepSample] = deque(maxlen=config.max_samples)
        self.serving: deque[ServingSample] = deque(maxlen=config.max_samples)
        self.host_cpu: deque[HostCpuSample] = deque(maxlen=config.max_samples)
        self.last_refit_s = -math.inf
        self.num_refits = 0
        # The parts the last refit kept for too few points: each is due as soon as it has
        # enough, not a whole interval after a refit of the others.
        self.waiting: tuple[str, ...] = ()
        # How many points each part was last fitted from (`refit_growth`).
        self.fitted_points: dict[str, int] = {}
        self.last_refit: Refit | None = None
        # When each refit over the window put a new model in force, oldest first: what the
        # Conductor believed when, so a twin replaying that stretch believes the same (over
        # a warm-up a long prefill's believed time moves by up to 3x from refit to refit, and
        # a request near its TTFT SLO is refused or not by the model of its moment).
        self.beliefs: deque[tuple[float, CostModel]] = deque()

    # -- the window -------------------------------------------------------------------------
    def add_prefill(self, samples: Iterable[PrefillSample]) -> None:
        self.prefill.extend(samples)

    def add_decode(self, samples: Iterable[DecodeStepSample]) -> None:
        self.decode.extend(samples)

    def add_serving(self, samples: Iterable[ServingSample]) -> None:
        self.serving.extend(samples)

    def add_host_cpu(self, samples: Iterable[HostCpuSample]) -> None:
        self.host_cpu.extend(samples)

    def is_due(self, now_s: float) -> bool:
        """Whether to refit now: an interval after the last refit; at once when a part the
        last refit kept for too few points now has enough (at speed 8 a Conductor's first
        refit fitted the serving path alone, 4 s into a 7.5 s warm-up, and prefill waited
        10 s, past the warm-up, on the idle profile); at once when a part's points have grown
        `refit_growth`-fold since its fit."""
        if now_s - self.last_refit_s >= self.config.refit_interval_s:
            return True
        if any(self._num_points(part) >= self._min_points(part) for part in self.waiting):
            return True
        growth = self.config.refit_growth
        return any(
            self._num_points(part) >= growth * fitted for part, fitted in self.fitted_points.items()
        )

    def _num_points(self, part: str) -> int:
        return len({"prefill": self.prefill, "decode": self.decode, "serving": self.serving}[part])

    def _min_points(self, part: str) -> int:
        return int(getattr(self.config, f"min_{part}_points"))

    def _trim(self, now_s: float) -> None:
        oldest_s = now_s - self.config.window_s
        for window in (self.prefill, self.decode, self.serving, self.host_cpu):
            if any(sample.time_s < oldest_s for sample in window):
                kept = [sample for sample in window if sample.time_s >= oldest_s]
                window.clear()
                window.extend(kept)
        # The newest model from before the window stays: it was in force as the window began.
        while len(self.beliefs) > 1 and self.beliefs[1][0] <= oldest_s:
            self.beliefs.popleft()

    # -- refits -----------------------------------------------------------------------------
    def refit(self, now_s: float) -> Refit:
        """Refit each part with enough points in the window; the others keep their fit. A
        refit that could update no part does not start the interval: the next check tries
        again (else a check before the first requests, at a Conductor's start, would put
        the first real refit `refit_interval_s` after it)."""
        self._trim(now_s)
        config, cost = self.config, self.cost
        updated: list[str] = []
        notes: list[str] = []
        prefill, decode, serving = cost.prefill, cost.decode, cost.serving
        if len(self.prefill) < config.min_prefill_points:
            notes.append(_too_few("prefill", len(self.prefill), config.min_prefill_points))
        else:
            points = [(s.input_tokens, s.cached_tokens, s.seconds) for s in self.prefill]
            fitted = fit_prefill(points, robust=True)
            prefill = _bounded(prefill, fitted, points, _prefill_s, config.max_change_factor)
            updated.append("prefill")
        if len(self.decode) < config.min_decode_points:
            notes.append(_too_few("decode", len(self.decode), config.min_decode_points))
        else:
            points = [(s.batch_size, s.context_tokens, s.seconds) for s in self.decode]
            fitted_decode = fit_decode(points, robust=True)
            decode = _bounded(decode, fitted_decode, points, _step_s, config.max_change_factor)
            updated.append("decode")
        if len(self.serving) < config.min_serving_points:
            notes.append(_too_few("serving", len(self.serving), config.min_serving_points))
        else:
            serving = self._serving_fit()
            updated.append("serving")
        if updated:  # counted and timed only when a part was fitted
            self.last_refit_s = now_s
            self.num_refits += 1
        self.fitted_points.update((part, self._num_points(part)) for part in updated)
        self.waiting = tuple(p for p in ("prefill", "decode", "serving") if p not in updated)
        self.cost = replace(cost, prefill=prefill, decode=decode, serving=serving)
        if updated and not self.cost.name.startswith("calibrated-"):
            self.cost = replace(self.cost, name=f"calibrated-{cost.name}")
        if self.cost != cost:
            self.beliefs.append((now_s, self.cost))
        self.last_refit = Refit(self.cost, tuple(updated), tuple(notes))
        return self.last_refit

    def shortfalls(self) -> list[str]:
        """Why a refit now would keep a part's fit: too few points of it in the window."""
        config = self.config
        wanted = (
            ("prefill", len(self.prefill), config.min_prefill_points),
            ("decode", len(self.decode), config.min_decode_points),
            ("serving", len(self.serving), config.min_serving_points),
        )
        return [_too_few(kind, have, need) for kind, have, need in wanted if have < need]

    def _serving_fit(self) -> ServingFit:
        """Medians of the per-request costs; per token: the mean streamed gap beyond the mean
        decode step of the same window; the prefill line's mean hand-over."""
        dispatch_s = float(np.median([s.dispatch_s for s in self.serving]))
        first_token_s = float(np.median([s.first_token_s for s in self.serving]))
        answers = [s.answer_s for s in self.serving if s.answer_s is not None]
        answer_s = float(np.median(answers)) if answers else 0.0
        # A mean, not a median: the queue estimate adds one per request ahead, so the long
        # ones (a thread woken late) count at their share.
        handovers = [s.handover_s for s in self.prefill if s.handover_s is not None]
        handover_s = self.cost.serving.handover_s  # kept until enough were measured
        if len(handovers) >= self.config.min_serving_points:
            handover_s = float(np.mean(handovers))
        gaps = [(s.tbt_mean_s, s.num_gaps) for s in self.serving if s.tbt_mean_s and s.num_gaps]
        per_token_s = 0.0
        if gaps and self.decode:
            mean_gap_s = sum(g * n for g, n in gaps) / sum(n for _, n in gaps)
            # Per token, as the gaps are: a step of batch b gives b gaps.
            steps = [(s.seconds, s.batch_size) for s in self.decode if s.batch_size > 0]
            mean_step_s = sum(t * b for t, b in steps) / max(1, sum(b for _, b in steps))
            per_token_s = max(0.0, mean_gap_s - mean_step_s)
        return ServingFit(
            dispatch_s=max(0.0, dispatch_s),
            first_token_s=max(0.0, first_token_s),
            per_token_s=per_token_s,
            answer_s=max(0.0, answer_s),
            handover_s=max(0.0, handover_s),
        )

    # -- what it shows ------------------------------------------------------------------------
    def residuals(self, cost: CostModel | None = None) -> dict[str, Any]:
        """Believed vs measured seconds of every prefill and decode step in the window, with
        the median relative error of each kind (for GET /v1/calibration and its plot)."""
        cost = cost or self.cost
        prefill = [
            {
                "time_s": s.time_s,
                "input_tokens": s.input_tokens,
                "cached_tokens": s.cached_tokens,
                "measured_s": s.seconds,
                "believed_s": cost.prefill_time_s(s.input_tokens, s.cached_tokens),
            }
            for s in self.prefill
        ]
        decode = [
            {
                "time_s": s.time_s,
                "batch_size": s.batch_size,
                "context_tokens": s.context_tokens,
                "measured_s": s.seconds,
                "believed_s": cost.decode_step_time_s(s.batch_size, s.context_tokens),
            }
            for s in self.decode
        ]
        return {
            "prefill": prefill,
            "decode": decode,
            "prefill_median_rel_err": _median_rel_err(prefill),
            "decode_median_rel_err": _median_rel_err(decode),
        }

    def snapshot(self) -> "Calibrator":
        """A copy of the model and the window as they are now, to read without the lock
        that guards this one (the live profile's fits take a tenth of a second)."""
        copy = Calibrator(self.base, self.config)
        copy.cost = self.cost
        copy.prefill.extend(self.prefill)
        copy.decode.extend(self.decode)
        copy.serving.extend(self.serving)
        copy.host_cpu.extend(self.host_cpu)
        copy.last_refit_s, copy.num_refits = self.last_refit_s, self.num_refits
        copy.waiting = self.waiting
        copy.fitted_points = dict(self.fitted_points)
        copy.last_refit = self.last_refit
        copy.beliefs.extend(self.beliefs)
        return copy

    def to_state(self, max_samples: int = 1024) -> dict[str, Any]:
        """JSON-ready model and the newest `max_samples` of each kind of the window, so a
        restarted Conductor resumes where it was (saved after each refit: kept small)."""
        return {
            "cost": self.cost.to_profile(),
            "num_refits": self.num_refits,
            "fitted_points": dict(self.fitted_points),
            "prefill": [asdict(s) for s in list(self.prefill)[-max_samples:]],
            "decode": [asdict(s) for s in list(self.decode)[-max_samples:]],
            "serving": [asdict(s) for s in list(self.serving)[-max_samples:]],
            "host_cpu": [asdict(s) for s in list(self.host_cpu)[-max_samples:]],
            "beliefs": [
                {"time_s": time_s, "cost": cost.to_profile()}
                for time_s, cost in list(self.beliefs)[-max_samples:]
            ],
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Take back a `to_state()`; ValueError (and nothing changed) when it is malformed."""
        try:
            cost = CostModel.from_profile(state["cost"])
            prefill = [PrefillSample(**s) for s in state.get("prefill", [])]
            decode = [DecodeStepSample(**s) for s in state.get("decode", [])]
            serving = [ServingSample(**s) for s in state.get("serving", [])]
            host_cpu = [HostCpuSample(**s) for s in state.get("host_cpu", [])]
            num_refits = int(state.get("num_refits", 0))
            # Absent from states saved before it was kept: refits then wait for the interval.
            fitted_points = {
                str(part): int(n) for part, n in state.get("fitted_points", {}).items()
            }
            if unknown := set(fitted_points) - {"prefill", "decode", "serving"}:
                raise ValueError(f"no part {sorted(unknown)} to count fitted points of")
            beliefs = [  # absent from states saved before they were kept
                (float(b["time_s"]), CostModel.from_profile(b["cost"]))
                for b in state.get("beliefs", [])
            ]
        except (KeyError, TypeError, AttributeError, ValueError) as error:
            raise ValueError(f"calibration state is malformed: {error}") from None
        self.cost = cost
        self.num_refits = num_refits
        self.fitted_points = fitted_points
        self.prefill.clear()
        self.prefill.extend(prefill)
        self.decode.clear()
        self.decode.extend(decode)
        self.serving.clear()
        self.serving.extend(serving)
        self.host_cpu.clear()
        self.host_cpu.extend(host_cpu)
        self.beliefs.clear()
        self.beliefs.extend(beliefs)


def _too_few(kind: str, have: int, need: int) -> str:
    return f"{kind}: {have} point(s) in the window, {need} needed; the fit is kept"


def _prefill_s(fit: PrefillFit, point: tuple[int, int, float]) -> float:
    return fit.time_s(point[0], point[1])


def _step_s(fit: DecodeFit, point: tuple[int, int, float]) -> float:
    return fit.step_s(point[0], point[1])


def _bounded(old, new, points, predict, factor: float):  # type: ignore[no-untyped-def]
    """`new`, or the blend of old and new whose median prediction over `points` moved by
    about `factor` when `new` would move it further (one refit cannot swing admission)."""
    old_s = np.array([predict(old, p) for p in points])
    new_s = np.array([predict(new, p) for p in points])
    if not (old_s > 0).all():
        return new
    ratio = float(np.median(new_s / old_s))
    if 1.0 / factor <= ratio <= factor:
        return new
    bound = factor if ratio > factor else 1.0 / factor
    alpha = (bound - 1.0) / (ratio - 1.0)
    old_fields, new_fields = asdict(old), asdict(new)
    return type(old)(
        **{k: old_fields[k] + alpha * (new_fields[k] - old_fields[k]) for k in old_fields}
    )


def _median_rel_err(rows: list[dict[str, Any]]) -> float | None:
    errors = [
        abs(r["believed_s"] - r["measured_s"]) / r["measured_s"]
        for r in rows
        if r["measured_s"] > 0
    ]
    return float(np.median(errors)) if errors else None
