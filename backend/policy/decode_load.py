"""Decode load, now, with a request added, or predicted ahead.

A decode instance's load is its predicted TBT over the TBT SLO or, when the
instance's KV memory is known, the share of that memory its batch fills, whichever is
higher: a 70B model with grouped-query attention fills its KV memory long before its step
time reaches a 0.1 s SLO, so a TBT-only load would call a full instance idle.

Also the local check a decode instance runs when a request reaches it (late rejection);
agents and the twin call `check_decode_arrival` so that check is the same code everywhere.
"""

from collections.abc import Iterable

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
    """Mean load over decode instances at `at_s`, when this request's prefill ends.

    Adds the requests now in prefill that will be ready by then, removes decoding requests
    whose elapsed decode time will exceed the uniform decode time `decode_time_s`, and adds
    this request to `chosen_instance_id`.
    """
    finished_before_s = at_s - decode_time_s
    step_s = cost.decode.step_s
    total = 0.0
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
        load = step_s(batch, context) / tbt_slo_s
        if state.kv_capacity_tokens:
            load = max(load, context / state.kv_capacity_tokens)
        total += load
        count += 1
    return total / count if count else 0.0


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
