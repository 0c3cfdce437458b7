"""Decode load, now, with a request added, or predicted ahead.

A decode instance's load is its predicted TBT over the TBT SLO or, when the
instance's KV memory is known, the share of that memory its batch fills, whichever is
higher: a 70B model with grouped-query attention fills its KV memory long before its step
time reaches a 0.1 s SLO, so a TBT-only load would call a full instance idle.

Also the local check a decode instance runs when a request reaches it (late rejection);
agents and the twin call `check_decode_arrival` so that check is the same code everywhere.
"""

import heapq
import statistics
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from backend.policy.cluster import DecodeState
from backend.policy.cost_model import CostModel
from backend.policy.effects import ArrivalCheck


def tbt_ratio(cost: CostModel, batch_size: int, context_tokens: int, tbt_slo_s: float) -> float:
    """Predicted time between tokens of a batch, as a fraction of the TBT SLO."""
    return cost.decode.step_s(batch_size, context_tokens) / tbt_slo_s


def load_of(
    cost: CostModel,
    batch_size: int,
    context_tokens: int,
    tbt_slo_s: float,
    kv_capacity_tokens: int | None,
) -> float:
    """max(TBT ratio, KV memory share) of a batch; 1.0 is full."""
    ratio = cost.decode.step_s(batch_size, context_tokens) / tbt_slo_s
    if kv_capacity_tokens:
        ratio = max(ratio, context_tokens / kv_capacity_tokens)
    return ratio


def choose_decode(
    cost: CostModel, states: Iterable[DecodeState], context_tokens: int, tbt_slo_s: float
) -> DecodeState:
    """d*: the instance with the lowest load if the request joined it, counting the requests
    already headed there (first on ties). `states` must not be empty."""
    best: DecodeState | None = None
    best_load = 0.0
    for state in states:
        batch = len(state.decoding) + len(state.incoming) + 1
        context = state.decoding_context_tokens + state.incoming_context_tokens + context_tokens
        load = load_of(cost, batch, context, tbt_slo_s, state.kv_capacity_tokens)
        if best is None or load < best_load:
            best, best_load = state, load
    if best is None:
        raise ValueError("no decode instance to choose from")
    return best


def current_ratio(
    cost: CostModel, state: DecodeState, context_tokens: int, tbt_slo_s: float
) -> float:
    """Load of the batch running now plus this request (what naive `early` checks)."""
    batch = len(state.decoding) + 1
    context = state.decoding_context_tokens + context_tokens
    return load_of(cost, batch, context, tbt_slo_s, state.kv_capacity_tokens)


@dataclass(frozen=True, slots=True)
class DecodeForecast:
    """How long early-predicted expects a request to decode.

    Learned (the default): the client's max_tokens times the share of it recent requests
    really generated, times the seconds per token they took. Before any completion the
    cost model's step time stands in for the seconds per token. `uniform_s` instead gives
    every request the same decode time (the paper's t_d, `learn_decode_time = false`).
    """

    seconds_per_token: float | None = None
    output_share: float = 1.0
    uniform_s: float | None = None

    def expected_tokens(self, max_tokens: int) -> int:
        return max(1, round(max_tokens * self.output_share))

    def decode_s(self, max_tokens: int, step_s: float) -> float:
        """Expected decode seconds of a request asking for `max_tokens`; `step_s`: the
        believed step of the batch it joins (used until a completion has been seen)."""
        if self.uniform_s is not None:
            return self.uniform_s
        per_token_s = self.seconds_per_token if self.seconds_per_token is not None else step_s
        return self.expected_tokens(max_tokens) * per_token_s


class DecodeTimes:
    """The recent completions early-predicted learns from: each one's decode seconds,
    generated tokens and max_tokens, the newest `window` of them; medians, so one stalled
    stream does not move the forecast. The mean and the forecast are computed once per
    completion, not per admission (both are read on every arrival)."""

    def __init__(self, window: int) -> None:
        self.seconds: deque[float] = deque(maxlen=window)
        self.per_token_s: deque[float] = deque(maxlen=window)
        self.output_share: deque[float] = deque(maxlen=window)
        self._mean_s: float | None = None
        self._forecast = DecodeForecast()

    def resize(self, window: int) -> None:
        if window == self.seconds.maxlen:
            return
        for name in ("seconds", "per_token_s", "output_share"):
            setattr(self, name, deque(getattr(self, name), maxlen=window))
        self._refresh()

    def add(self, seconds: float, generated_tokens: int | None, max_tokens: int) -> None:
        self.seconds.append(seconds)
        if generated_tokens:  # drivers that do not count tokens teach only the mean time
            self.per_token_s.append(seconds / generated_tokens)
            self.output_share.append(min(1.0, generated_tokens / max(1, max_tokens)))
        self._refresh()

    def mean_s(self) -> float | None:
        return self._mean_s

    def forecast(self) -> DecodeForecast:
        return self._forecast

    def _refresh(self) -> None:
        self._mean_s = sum(self.seconds) / len(self.seconds) if self.seconds else None
        self._forecast = (
            DecodeForecast(
                seconds_per_token=statistics.median(self.per_token_s),
                output_share=statistics.median(self.output_share),
            )
            if self.per_token_s
            else DecodeForecast()
        )


def predicted_mean_ratio(
    cost: CostModel,
    states: Iterable[DecodeState],
    *,
    chosen_instance_id: str,
    context_tokens: int,
    at_s: float,
    tbt_slo_s: float,
) -> float:
    """Mean load over decode instances at `at_s`, when this request's prefill ends.

    Counts the requests decoding now that will still be decoding then (each by the end its
    forecast gave it when it was booked), the requests in prefill that will have started
    and not yet finished, each with the KV it will hold by then (its prompt plus the tokens
    generated so far at its forecast pace), and this request on `chosen_instance_id`.
    """
    fit = cost.decode
    fixed_s, per_request_s, per_context_s = fit.fixed_s, fit.per_request_s, fit.per_context_token_s
    total = 0.0
    count = 0
    # On every admission, over every request of every decode instance: the step-time form
    # and the per-request growth are written out here rather than called (DecodeFit.step_s,
    # DecodingRequest.context_at and IncomingRequest.context_at say the same).
    for state in states:
        batch = 0
        context = 0.0
        for running in state.decoding.values():
            expected_s = running.expected_s
            left_s = running.started_s + expected_s - at_s
            if left_s > 0:
                batch += 1
                grown = running.context_tokens
                if running.expected_tokens and left_s < expected_s:
                    paced = running.prompt_tokens + running.expected_tokens * (
                        1.0 - left_s / expected_s
                    )
                    if paced > grown:
                        grown = paced
                context += grown
        for incoming in state.incoming.values():
            since_s = at_s - incoming.ready_s
            if 0 <= since_s < incoming.expected_s:
                batch += 1
                context += incoming.context_tokens
                if incoming.expected_tokens:
                    context += incoming.expected_tokens * since_s / incoming.expected_s
        if state.instance_id == chosen_instance_id:
            batch += 1
            context += context_tokens
        load = 0.0
        if batch > 0:
            step = fixed_s + per_request_s * batch + per_context_s * round(context)
            load = step / tbt_slo_s
        capacity = state.kv_capacity_tokens
        if capacity and context / capacity > load:
            load = context / capacity
        total += load
        count += 1
    return total / count if count else 0.0


@dataclass(frozen=True, slots=True)
class ForecastRecord:
    """One admitted request's forecast of the mean decode load at `at_s` (the end of its
    prefill), and the load the pool then had (its batches as the core saw them)."""

    made_s: float
    at_s: float
    predicted: float
    realized: float


class ForecastLog:
    """Early-predicted's forecasts waiting for their moment, and the settled ones (newest
    `max_records`), with their running error: how right the predictor is."""

    def __init__(self, max_records: int = 100_000) -> None:
        self._pending: list[tuple[float, int, float, float]] = []  # (at_s, seq, made_s, predicted)
        self._seq = 0
        self.records: deque[ForecastRecord] = deque(maxlen=max_records)
        self.num_settled = 0
        self.sum_abs_error = 0.0
        self.sum_error = 0.0

    def add(self, made_s: float, at_s: float, predicted: float) -> None:
        heapq.heappush(self._pending, (at_s, self._seq, made_s, predicted))
        self._seq += 1

    def settle(self, now_s: float, realized: Callable[[], float]) -> None:
        """Settle every forecast due by `now_s` against `realized()`, the load now."""
        if not self._pending or self._pending[0][0] > now_s:
            return
        load = realized()
        while self._pending and self._pending[0][0] <= now_s:
            at_s, _, made_s, predicted = heapq.heappop(self._pending)
            self.records.append(ForecastRecord(made_s, at_s, predicted, load))
            self.num_settled += 1
            self.sum_abs_error += abs(predicted - load)
            self.sum_error += predicted - load

    def summary(self) -> dict[str, float | int | None]:
        """The error of every forecast settled so far (see `forecast_error`)."""
        n = self.num_settled
        return {
            "num_decode_forecasts": n,
            "decode_forecast_mae": self.sum_abs_error / n if n else None,
            "decode_forecast_bias": self.sum_error / n if n else None,
        }

    def between(self, start_s: float, end_s: float) -> list[ForecastRecord]:
        """The kept forecasts made in [start_s, end_s)."""
        return [r for r in self.records if start_s <= r.made_s < end_s]


def forecast_error(records: Iterable[ForecastRecord]) -> dict[str, float | int | None]:
    """`decode_forecast_mae` and `decode_forecast_bias` (predicted - realized) of the mean
    decode load, in load units (1.0 is the TBT SLO or full KV memory), over `records`: the
    same figures in the twin's report and the live /v1/report."""
    errors = [r.predicted - r.realized for r in records]
    n = len(errors)
    return {
        "num_decode_forecasts": n,
        "decode_forecast_mae": sum(abs(e) for e in errors) / n if n else None,
        "decode_forecast_bias": sum(errors) / n if n else None,
    }


def mean_load(cost: CostModel, states: Iterable[DecodeState], tbt_slo_s: float) -> float:
    """The mean load of the decode instances' batches now."""
    loads = [
        load_of(cost, len(s.decoding), s.decoding_context_tokens, tbt_slo_s, s.kv_capacity_tokens)
        for s in states
    ]
    return sum(loads) / len(loads) if loads else 0.0


def check_decode_arrival(
    check: ArrivalCheck,
    *,
    batch_size: int,
    context_tokens: int,
    new_context_tokens: int,
    kv_capacity_tokens: int | None = None,
) -> str | None:
    """The decode instance's local check on a request's arrival: a rejection reason or None.

    `batch_size` and `context_tokens` describe the batch running on the instance now; the
    check (SLO and step model) is the one the request was dispatched with.
    """
    if kv_capacity_tokens is not None and context_tokens + new_context_tokens > kv_capacity_tokens:
        return "kv_capacity"
    step_s = check.decode.step_s(batch_size + 1, context_tokens + new_context_tokens)
    if step_s / check.tbt_slo_s > 1.0:
        return "tbt_slo"
    return None
