"""Decode load: predicted TBT over the TBT SLO, now, with a request added, or predicted ahead.

Also the local check a decode instance runs when a request reaches it (late rejection);
agents and the twin call `check_decode_arrival` so that check is the same code everywhere.
"""

from collections.abc import Iterable

from backend.policy.cluster import DecodeState
from backend.policy.cost_model import CostModel


def tbt_ratio(cost: CostModel, batch_size: int, context_tokens: int, tbt_slo_s: float) -> float:
    """Predicted time between tokens of a batch, as a fraction of the TBT SLO."""
    return cost.decode.step_s(batch_size, context_tokens) / tbt_slo_s


def choose_decode(
    cost: CostModel, states: Iterable[DecodeState], context_tokens: int
) -> DecodeState:
    """d*: the instance with the lowest TBT if the request joined it, counting the requests
    already headed there (first on ties). `states` must not be empty.

    Ranking by step time ranks by TBT ratio too: every instance shares the request's SLO.
    """
    step_s = cost.decode.step_s
    best: DecodeState | None = None
    best_s = 0.0
    for state in states:
        batch = len(state.decoding) + len(state.incoming) + 1
        context = state.decoding_context_tokens + state.incoming_context_tokens + context_tokens
        seconds = step_s(batch, context)
        if best is None or seconds < best_s:
            best, best_s = state, seconds
    if best is None:
        raise ValueError("no decode instance to choose from")
    return best


def current_ratio(
    cost: CostModel, state: DecodeState, context_tokens: int, tbt_slo_s: float
) -> float:
    """TBT ratio of the batch running now plus this request (what naive `early` checks)."""
    batch = len(state.decoding) + 1
    context = state.decoding_context_tokens + context_tokens
    return tbt_ratio(cost, batch, context, tbt_slo_s)


def predicted_mean_ratio(
    cost: CostModel,
    states: Iterable[DecodeState],
    *,
    chosen_instance_id: str,
    context_tokens: int,
    at_s: float,
    decode_time_s: float,
    tbt_slo_s: float,
) -> float:
    """Mean TBT ratio over decode instances at `at_s`, when this request's prefill ends.

    Adds the requests now in prefill that will be ready by then, removes decoding requests
    whose elapsed decode time will exceed the uniform decode time `decode_time_s`, and adds
    this request to `chosen_instance_id`.
    """
    finished_before_s = at_s - decode_time_s
    step_s = cost.decode.step_s
    total_s = 0.0
    count = 0
    for state in states:
        batch = len(state.decoding)
        context = state.decoding_context_tokens
        # Decoding requests are in start order: stop at the first one still running at_s.
        for running in state.decoding.values():
            if running.started_s > finished_before_s:
                break
            batch -= 1
            context -= running.context_tokens
        for incoming in state.incoming.values():
            if incoming.ready_s <= at_s:
                batch += 1
                context += incoming.context_tokens
        if state.instance_id == chosen_instance_id:
            batch += 1
            context += context_tokens
        total_s += step_s(batch, context)
        count += 1
    return total_s / count / tbt_slo_s if count else 0.0


def check_decode_arrival(
    cost: CostModel,
    *,
    batch_size: int,
    context_tokens: int,
    new_context_tokens: int,
    tbt_slo_s: float,
    kv_capacity_tokens: int | None = None,
) -> str | None:
    """The decode instance's local check on a request's arrival: a rejection reason or None.

    `batch_size` and `context_tokens` describe the batch running on the instance now.
    """
    if kv_capacity_tokens is not None and context_tokens + new_context_tokens > kv_capacity_tokens:
        return "kv_capacity"
    if tbt_ratio(cost, batch_size + 1, context_tokens + new_context_tokens, tbt_slo_s) > 1.0:
        return "tbt_slo"
    return None
