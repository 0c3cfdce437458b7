"""Gathering a prefill's reused prefix: local blocks from the shard, then fetched ones.

The plan's keys must be the prompt's leading block keys. A local block the shard no longer
holds (the Conductor's index lags the shard's evictions by up to a heartbeat), a block that
fails its checksum, or a fetch that fails only shortens the prefix: the prefill then
computes those tokens itself, and a missing block is reported evicted so the index forgets
it. Reuse must be contiguous, so everything after the first lost block is recomputed too.
"""

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from agents.pool import CorruptBlock, KvEvent, KvPoolShard, MissingBlock
from agents.transport import CorruptBlocksError, Transport, TransportError
from backend.policy.effects import CachePlan
from backend.policy.events import KvEvicted

logger = logging.getLogger(__name__)


class PlanError(Exception):
    """A dispatch the agent cannot run as planned; `code` is a grpc.StatusCode name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(slots=True)
class Prefix:
    """The reused blocks in prefix order, with the pins to release after the prefill."""

    keys: list[int] = field(default_factory=list)
    blocks: list[memoryview | bytes] = field(default_factory=list)
    num_fetched: int = 0
    recomputed_keys: list[int] = field(default_factory=list)
    events: list[KvEvent] = field(default_factory=list)
    pinned: tuple[int, ...] = ()
    load_s: float = 0.0
    fetch_s: float = 0.0


def check_plan(plan: CachePlan, prompt_keys: Sequence[int]) -> None:
    planned = plan.local_keys + (plan.fetch.keys if plan.fetch is not None else ())
    for depth, key in enumerate(planned):
        if depth >= len(prompt_keys) or prompt_keys[depth] != key:
            raise PlanError(
                "INVALID_ARGUMENT",
                f"plan key {key:#x} at block {depth} is not the prompt's block key there "
                f"(the prompt has {len(prompt_keys)} full blocks)",
            )


def gather(
    shard: KvPoolShard,
    transport: Transport,
    plan: CachePlan,
    fetch_address: str | None,
    prompt_keys: Sequence[int],
    now_s: float,
) -> Prefix:
    """Load and fetch the plan's blocks; the caller unpins `prefix.pinned` when done."""
    check_plan(plan, prompt_keys)
    prefix = Prefix()
    local = plan.local_keys
    if local:
        started_s = time.perf_counter()
        shard.pin(local)
        prefix.pinned = local
        try:
            _load_local(shard, local, now_s, prefix)
        except BaseException:
            shard.unpin(local)
            raise
        prefix.load_s = time.perf_counter() - started_s
    if plan.fetch is None:
        return prefix
    fetch_keys = plan.fetch.keys
    if len(prefix.keys) < len(local):  # a local block was lost: nothing after it is usable
        prefix.recomputed_keys.extend(fetch_keys)
        return prefix
    if not fetch_address:
        raise PlanError("INVALID_ARGUMENT", "the plan fetches blocks but names no data address")
    started_s = time.perf_counter()
    fetched = _fetch(transport, fetch_address, fetch_keys)
    prefix.fetch_s = time.perf_counter() - started_s
    prefix.keys.extend(fetch_keys[: len(fetched)])
    prefix.blocks.extend(fetched)
    prefix.num_fetched = len(fetched)
    prefix.recomputed_keys.extend(fetch_keys[len(fetched) :])
    return prefix


def _load_local(shard: KvPoolShard, keys: tuple[int, ...], now_s: float, prefix: Prefix) -> None:
    try:
        loaded = shard.load(keys, now_s)
    except MissingBlock as missing:
        logger.info("%s (evicted since the plan was made); recomputing from there", missing)
        prefix.events.append(KvEvicted(now_s, shard.instance_id, (missing.key,)))
        good = keys[: keys.index(missing.key)]
        prefix.recomputed_keys.extend(keys[len(good) :])
        if good:
            _load_local(shard, good, now_s, prefix)
        return
    except CorruptBlock as corrupt:
        logger.warning("%s; recomputing from there", corrupt)
        prefix.events.extend(corrupt.events)
        first_bad = min((keys.index(key) for key in corrupt.keys if key in keys), default=0)
        good = keys[:first_bad]
        prefix.recomputed_keys.extend(keys[len(good) :])
        if not good:
            return
        loaded = shard.load(good, now_s)
        keys = good
    prefix.events.extend(loaded.events)
    prefix.keys.extend(keys)
    prefix.blocks.extend(loaded.blocks)


def _fetch(transport: Transport, peer: str, keys: tuple[int, ...]) -> list[memoryview]:
    """The longest verified leading run of `keys` from `peer` (empty when it all failed)."""
    try:
        return transport.fetch(peer, keys)
    except CorruptBlocksError as corrupt:
        logger.warning("%s; recomputing those tokens", corrupt)
        run: list[memoryview] = []
        for key in keys:
            if key not in corrupt.good:
                break
            run.append(corrupt.good[key])
        return run
    except TransportError as error:  # missing blocks, or the peer or link failed
        logger.warning("fetch of %d block(s) failed: %s; recomputing them", len(keys), error)
        return []
