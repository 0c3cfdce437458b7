"""Prefill routing: the paper's Algorithm 1 (`kvcache-centric`) and its comparison baselines.

For every prefill instance p Algorithm 1 estimates
    TTFT[p] = T_queue[p] + T_prefill(input, prefix[p])                       (local branch)
    TTFT[p] = T_queue[p] + T_transfer(best -> p) + T_prefill(input, best)    (transfer branch)
where p takes the transfer branch iff best > prefix[p], the threshold is finite and
best >= threshold * prefix[p]; the lowest TTFT wins. `cache-aware` is the same at
threshold inf, `load-balancing` picks the shortest queue, `random` picks uniformly (seeded).
"""

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from backend.policy.cost_model import CostModel
from backend.policy.effects import CachePlan, FetchSpan, InstanceEstimate


class PrefillCandidate(NamedTuple):
    """What routing needs to know of one live prefill instance at decision time."""

    instance_id: str
    queue_s: float
    link_backlog_s: float


@dataclass(frozen=True, slots=True)
class RoutingChoice:
    """The chosen instance, its estimate and plan, and every instance's estimate."""

    chosen: InstanceEstimate
    plan: CachePlan
    source_instance_id: str | None
    candidates: tuple[InstanceEstimate, ...]


def uses_transfer(prefix_blocks: int, best_blocks: int, threshold: float) -> bool:
    """Whether an instance with `prefix_blocks` cached fetches the `best_blocks` prefix."""
    return (
        best_blocks > prefix_blocks
        and not math.isinf(threshold)
        and best_blocks >= threshold * prefix_blocks
    )


def estimate_ttfts(
    candidates: Sequence[PrefillCandidate],
    prefix_blocks: Mapping[str, int],
    *,
    num_input_tokens: int,
    block_size: int,
    threshold: float,
    cost: CostModel,
) -> tuple[list[InstanceEstimate], str | None]:
    """Algorithm 1's per-instance TTFT estimates, and the holder a transfer would use.

    The source is the least backlogged instance holding the best prefix (first on ties).
    """
    best_blocks = max((prefix_blocks[c.instance_id] for c in candidates), default=0)
    source: PrefillCandidate | None = None
    if best_blocks > 0:
        for candidate in candidates:
            if prefix_blocks[candidate.instance_id] == best_blocks and (
                source is None or candidate.link_backlog_s < source.link_backlog_s
            ):
                source = candidate
    estimates = []
    # Most instances share a prefix length (often 0): compute each prefill time once.
    prefill_s_by_blocks: dict[int, float] = {}
    for candidate in candidates:
        local_blocks = prefix_blocks[candidate.instance_id]
        fetches = source is not None and uses_transfer(local_blocks, best_blocks, threshold)
        if fetches:
            transfer_s = cost.transfer_time_s(
                (best_blocks - local_blocks) * block_size, source.link_backlog_s
            )
            reused_blocks = best_blocks
        else:
            transfer_s = 0.0
            reused_blocks = local_blocks
        prefill_s = prefill_s_by_blocks.get(reused_blocks)
        if prefill_s is None:
            prefill_s = cost.prefill_time_s(num_input_tokens, reused_blocks * block_size)
            prefill_s_by_blocks[reused_blocks] = prefill_s
        estimates.append(
            InstanceEstimate(
                instance_id=candidate.instance_id,
                prefix_blocks=local_blocks,
                queue_s=candidate.queue_s,
                transfer_s=transfer_s,
                prefill_s=prefill_s,
                ttft_s=candidate.queue_s + transfer_s + prefill_s,
                uses_transfer=fetches,
            )
        )
    return estimates, source.instance_id if source is not None else None


def route_prefill(
    candidates: Sequence[PrefillCandidate],
    prefix_blocks: Mapping[str, int],
    block_keys: Sequence[int],
    *,
    scheduler: str,
    num_input_tokens: int,
    block_size: int,
    threshold: float,
    cost: CostModel,
    rng: random.Random,
) -> RoutingChoice:
    """Choose the prefill instance for one request; `candidates` must not be empty.

    Ties on TTFT go to the longer local prefix, then to the earlier candidate.
    """
    if scheduler not in ("kvcache-centric", "cache-aware"):
        threshold = math.inf  # the baselines never fetch
    estimates, source_id = estimate_ttfts(
        candidates,
        prefix_blocks,
        num_input_tokens=num_input_tokens,
        block_size=block_size,
        threshold=threshold,
        cost=cost,
    )
    if scheduler == "random":
        chosen = estimates[rng.randrange(len(estimates))]
    elif scheduler == "load-balancing":
        chosen = min(estimates, key=lambda e: e.queue_s)
    else:
        chosen = min(estimates, key=lambda e: (e.ttft_s, -e.prefix_blocks))
    local_keys = tuple(block_keys[: chosen.prefix_blocks])
    if chosen.uses_transfer and source_id is not None:
        best_blocks = prefix_blocks[source_id]
        fetch = FetchSpan(source_id, tuple(block_keys[chosen.prefix_blocks : best_blocks]))
        reused_blocks = best_blocks
    else:
        fetch = None
        reused_blocks = chosen.prefix_blocks
    reused_tokens = reused_blocks * block_size
    plan = CachePlan(
        local_keys=local_keys,
        fetch=fetch,
        num_reused_tokens=reused_tokens,
        num_compute_tokens=max(num_input_tokens - reused_tokens, 1),
    )
    return RoutingChoice(
        chosen=chosen,
        plan=plan,
        source_instance_id=source_id if fetch is not None else None,
        candidates=tuple(estimates),
    )
