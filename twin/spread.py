"""MeasuredSpread: the variation a live cluster showed, replayed in the twin.

A live profile (`backend.observe.live_profile`) carries, besides the central times, the
quantiles of what was measured around them: each prefill's and each decode step's ratio to
the central time, the serving path's dispatch and first-token delays, and on a shared host
the share of a core decode steps and prefills got at each number of busy agents
(backend/observe/host_share.py). A twin run on it draws every duration's factor (and every
delay, and every rate) from those quantiles with a seeded
generator, so the tails a loaded machine shows (a prefill slowed by a decode step beside
it, a first token waiting behind a long step) reach the twin's queues and percentiles.
"""

import itertools
import random
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from twin.wrapped import WrappedTiming

SPREAD_KEYS = (
    "prefill_factor",
    "decode_factor",
    "dispatch_s",
    "answer_s",
    "first_token_s",
    "handover_s",
)
# decode_rate_N / prefill_rate_N: the share of a core decode steps / prefills got while N
# agents computed (N >= 1).
DECODE_RATE = re.compile(r"decode_rate_([1-9][0-9]*)")
PREFILL_RATE = re.compile(r"prefill_rate_([1-9][0-9]*)")
# prefill_rate_N_from_Xms: the same of the prefills of X ms of CPU or more (up to the next
# class's X); prefill_rate_N is then that of the shortest.
PREFILL_RATE_FROM = re.compile(r"prefill_rate_([1-9][0-9]*)_from_([0-9]+(?:\.[0-9]+)?)ms")
# decode_pause_N: the decode loop's pause between two steps of a batch, in seconds, while N
# other agents computed (N >= 0).
DECODE_PAUSE = re.compile(r"decode_pause_(0|[1-9][0-9]*)")
_BY_COUNT = (DECODE_RATE, PREFILL_RATE, PREFILL_RATE_FROM, DECODE_PAUSE)


class Quantiles:
    """Draws by the inverse of the CDF through evenly spaced quantiles (linear between)."""

    def __init__(self, values: Sequence[float]) -> None:
        if len(values) < 2 or any(b < a for a, b in itertools.pairwise(values)):
            raise ValueError("quantiles must be at least two non-decreasing numbers")
        if values[0] < 0:
            raise ValueError("quantiles must be non-negative")
        self.values = [float(v) for v in values]

    def draw(self, rng: random.Random) -> float:
        position = rng.random() * (len(self.values) - 1)
        index = min(int(position), len(self.values) - 2)
        low, high = self.values[index], self.values[index + 1]
        return low + (high - low) * (position - index)

    def at(self, q: float) -> float:
        """The q-quantile (0 <= q <= 1)."""
        position = q * (len(self.values) - 1)
        index = min(int(position), len(self.values) - 2)
        low, high = self.values[index], self.values[index + 1]
        return low + (high - low) * (position - index)


def read_spread(data: Mapping[str, Any]) -> dict[str, Quantiles]:
    """The `spread` section: quantile lists by SPREAD_KEYS (each optional); ValueError names
    the bad one."""
    section = data.get("spread", {})
    if not isinstance(section, Mapping):
        raise ValueError("'spread' must be a JSON object")
    unknown = sorted(
        k
        for k in section
        if k not in SPREAD_KEYS and not any(pattern.fullmatch(k) for pattern in _BY_COUNT)
    )
    if unknown:
        raise ValueError(f"'spread' has unknown key(s): {', '.join(unknown)}")
    spreads = {}
    for key, values in section.items():
        try:
            spreads[key] = Quantiles(values)
        except (TypeError, ValueError) as error:
            raise ValueError(f"'spread.{key}': {error}") from None
    return spreads


class MeasuredSpread(WrappedTiming):
    """A timing model whose durations and serving delays vary as the live ones did."""

    def __init__(self, base: Any, spreads: Mapping[str, Quantiles], seed: int) -> None:
        super().__init__(base)
        self.spreads = dict(spreads)
        self._random = random.Random(seed)
        self._decode_rates = _by_count(self.spreads, DECODE_RATE)
        # By the shortest CPU seconds of each length class: the rates by busy count.
        self._prefill_classes = _prefill_classes(self.spreads)
        self._decode_pauses = _by_count(self.spreads, DECODE_PAUSE)

    @property
    def name(self) -> str:
        return f"{self.base.name}+measured-spread"

    def _factor(self, key: str) -> float:
        spread = self.spreads.get(key)
        return spread.draw(self._random) if spread is not None else 1.0

    def prefill_s(self, input_tokens: int, cached_tokens: int) -> float:
        return self.base.prefill_s(input_tokens, cached_tokens) * self._factor("prefill_factor")

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float:
        return self.base.decode_step_s(batch_size, context_tokens) * self._factor("decode_factor")

    def decode_share(self) -> Callable[[int], float] | None:
        """A decode step's share of a core by busy agents, at one quantile drawn for the
        step (the decode instance draws again at each step's end) and kept while the count
        changes under it: at the nearest busy count measured (at most the count, else the
        least); beyond the most crowding measured, slowed by processor sharing; None when
        none was measured.

        One draw per step, as live measured them: drawn once per stretch of constant
        batch, a lone request kept one share for all its steps, and where the batch
        changed by the clock (requests joining every few steps) the stretches a slow draw
        held ran fewer steps, so the steps ran at the mean share, not at the mean of their
        times: at speed 10 on a 2-CPU host the twin's batch-1 steps took 1.19x their solo
        time where live's took 1.39x, on the window's own calibration.

        Not a new draw at every change of the count: under load the count changes every
        step or more often (a prefill starts or ends every few tens of milliseconds), and
        a batch re-drawn at each change progresses at the mean of the drawn shares, where
        live's steps are whole and take the mean of their times (a step preempted to a
        third of a core is not cut short by the next prefill's start). Re-drawn at each
        change, the twin's steps at speed 8 on a 2-CPU host ran 10-15 % faster than the
        very spread they drew from (E[r] E[1/r] of the measured rates)."""
        measured = self._decode_rates
        if not measured:
            return None
        quantile = self._random.random()
        return lambda num_busy: _rate_at(measured, num_busy, quantile)

    def prefill_share(self, solo_s: float = 0.0) -> Callable[[int], float] | None:
        """One prefill's share of a core by busy agents, as `decode_share` reads it, at one
        quantile drawn for the whole prefill (a prefill keeps its luck with the scheduler:
        live's short ones got a core at once or waited, 1.2x to 4.3x their CPU time at one
        count), from the rates of the prefills of its length class (its `solo_s`) where
        the profile has classes: the live profile's quantiles weight each prefill by its
        CPU seconds, so the work gets the luck live's work had
        (backend/observe/host_share.py: prefill_rates_by_length); None when none was
        measured."""
        classes = self._prefill_classes
        if not classes:
            return None
        below = [from_s for from_s in classes if from_s <= solo_s]
        measured = classes[max(below) if below else min(classes)]
        quantile = self._random.random()
        return lambda num_busy: _rate_at(measured, num_busy, quantile)

    @property
    def measures_decode_pauses(self) -> bool:
        return bool(self._decode_pauses)

    def decode_pause_s(self, num_busy: int) -> float | None:
        """The decode loop's pause before its next step while `num_busy` other agents
        compute, drawn from the pauses measured at the nearest count (at most the count,
        else the least; beyond the most crowding measured, lengthened by processor
        sharing); None when none was measured.

        Live's loop hands out each step's tokens and takes in requests between two steps,
        on a core it shares: a median 0.02 ms, but 0.6-1.0 ms on average beside two busy
        prefill agents (a step of 12-16 ms; 0.05-0.2 ms beside none) on a 2-CPU host at
        speed 9, 2P:1D. The host's busy count leaves the loop out meanwhile, so the
        prefills got a core more often than a twin whose decode was busy throughout."""
        measured = self._decode_pauses
        if not measured:
            return None
        below = [n for n in measured if n <= num_busy]
        seen = max(below) if below else min(measured)
        pause_s = measured[seen].draw(self._random)
        most = max(measured)
        return pause_s * num_busy / most if num_busy > most > 0 else pause_s

    def dispatch_delay_s(self) -> float:
        spread = self.spreads.get("dispatch_s")
        return spread.draw(self._random) if spread is not None else self.serving.dispatch_s

    def answer_delay_s(self) -> float:
        spread = self.spreads.get("answer_s")
        return spread.draw(self._random) if spread is not None else self.serving.answer_s

    def first_token_delay_s(self) -> float:
        spread = self.spreads.get("first_token_s")
        return spread.draw(self._random) if spread is not None else self.serving.first_token_s

    def handover_delay_s(self) -> float:
        spread = self.spreads.get("handover_s")
        return spread.draw(self._random) if spread is not None else self.serving.handover_s


def _by_count(spreads: Mapping[str, Quantiles], pattern: re.Pattern[str]) -> dict[int, Quantiles]:
    return {
        int(match.group(1)): quantiles
        for key, quantiles in spreads.items()
        if (match := pattern.fullmatch(key))
    }


def _prefill_classes(spreads: Mapping[str, Quantiles]) -> dict[float, dict[int, Quantiles]]:
    """The prefill rates by busy count of each length class, by its shortest CPU seconds
    (prefill_rate_N: from 0)."""
    classes: dict[float, dict[int, Quantiles]] = {}
    for key, quantiles in spreads.items():
        if match := PREFILL_RATE.fullmatch(key):
            classes.setdefault(0.0, {})[int(match.group(1))] = quantiles
        elif match := PREFILL_RATE_FROM.fullmatch(key):
            from_s = float(match.group(2)) / 1000.0
            classes.setdefault(from_s, {})[int(match.group(1))] = quantiles
    return classes


def _rate_at(measured: Mapping[int, Quantiles], num_busy: int, quantile: float) -> float:
    """The rate at `quantile` at the nearest busy count measured (at most `num_busy`, else
    the least); beyond the most crowding measured, slowed by processor sharing."""
    below = [n for n in measured if n <= num_busy]
    seen = max(below) if below else min(measured)
    rate = measured[seen].at(quantile)
    most = max(measured)
    return rate * most / num_busy if num_busy > most else rate
