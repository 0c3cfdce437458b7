"""Prefill routing: the paper's Algorithm 1 (`kvcache-centric`) and its comparison baselines.

For every prefill instance p Algorithm 1 estimates
    TTFT[p] = T_queue[p] + T_prefill(input, prefix[p])                       (local branch)
    TTFT[p] = T_queue[p] + T_transfer(best -> p) + T_prefill(input, best)    (transfer branch)
with T_transfer over the measured link from the holder to p where one was measured
(backend.policy.links),
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
from backend.policy.links import LinkEstimates


class PrefillCandidate(NamedTuple):
    """What routing needs to know of one live prefill instance at decision time."""

    instance_id: str
    queue_s: float
    link_backlog_s: float
    pace: float = 1.0  # measured over predicted prefill time (PrefillState.pace)


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
    links: LinkEstimates | None = None,
) -> tuple[list[InstanceEstimate], dict[str, str]]:
    """Algorithm 1's per-instance TTFT estimates, and for each instance that would fetch,
    the holder it would fetch from.

    The holder is the one of the best prefix whose transfer to that instance ends first:
    its outgoing backlog plus the bytes over the pair's measured link (`links`; the
    profile's bandwidth where a pair was never measured). First holder on ties.
    """
    best_blocks = max((prefix_blocks[c.instance_id] for c in candidates), default=0)
    holders = [
        c for c in candidates if best_blocks > 0 and prefix_blocks[c.instance_id] == best_blocks
    ]
    estimates = []
    sources: dict[str, str] = {}
    # Most instances share a prefix length (often 0): compute each prefill time once.
    prefill_s_by_blocks: dict[int, float] = {}
    for candidate in candidates:
        local_blocks = prefix_blocks[candidate.instance_id]
        fetches = bool(holders) and uses_transfer(local_blocks, best_blocks, threshold)
        transfer_s = 0.0
        reused_blocks = local_blocks
        if fetches:
            num_tokens = (best_blocks - local_blocks) * block_size
            source_id, transfer_s = _first_transfer(
                holders, candidate.instance_id, num_tokens, cost, links
            )
            sources[candidate.instance_id] = source_id
            reused_blocks = best_blocks
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
                ttft_s=candidate.queue_s + candidate.pace * (transfer_s + prefill_s),
                uses_transfer=fetches,
            )
        )
    return estimates, sources


def _first_transfer(
    holders: Sequence[PrefillCandidate],
    destination: str,
    num_tokens: int,
    cost: CostModel,
    links: LinkEstimates | None,
) -> tuple[str, float]:
    """The holder whose transfer of `num_tokens` to `destination` ends first, and its time."""
    best: tuple[str, float] | None = None
    for holder in holders:
        seconds_per_byte = (
            links.seconds_per_byte(holder.instance_id, destination) if links is not None else None
        )
        seconds = cost.transfer_time_s(num_tokens, holder.link_backlog_s, seconds_per_byte)
        if best is None or seconds < best[1]:
            best = (holder.instance_id, seconds)
    if best is None:
        raise ValueError("a transfer needs at least one holder of the prefix")
    return best


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
    links: LinkEstimates | None = None,
) -> RoutingChoice:
    """Choose the prefill instance for one request; `candidates` must not be empty.

    Ties on TTFT go to the longer local prefix, then to the earlier candidate.
    """
    if scheduler not in ("kvcache-centric", "cache-aware"):
        threshold = math.inf  # the baselines never fetch
    estimates, sources = estimate_ttfts(
        candidates,
        prefix_blocks,
        num_input_tokens=num_input_tokens,
        block_size=block_size,
        threshold=threshold,
        cost=cost,
        links=links,
    )
    if scheduler == "random":
        chosen = estimates[rng.randrange(len(estimates))]
    elif scheduler == "load-balancing":
        chosen = min(estimates, key=lambda e: e.queue_s)
    else:
        chosen = min(estimates, key=lambda e: (e.ttft_s, -e.prefix_blocks))
    local_keys = tuple(block_keys[: chosen.prefix_blocks])
    source_id = sources.get(chosen.instance_id)
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
