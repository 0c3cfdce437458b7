"""PrefillInstance: a prefill node of the twin, its compute, its outgoing link, its shard.

A job waits its turn on the instance's worker (FIFO); one that waited behind another starts
after the line's hand-over (`handover_delay_s`, as a live agent's thread is woken). Holding
the worker, as a live agent holds its prefill worker, it fetches the blocks its cache plan
names over the holder's outgoing link (one transfer's bytes at a time, so a hot holder
congests), then computes; the next job starts after both. Reused KV is loaded layer by
layer while computing, so the compute lasts max(compute, load). Long prompts in a
chunked-pipeline group hold every member of the group and run chunk by chunk through its
stages. The prompt's KV goes to the decode side afterwards (the cluster sends it over this
instance's link, `send`).
"""

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import simpy

from backend.policy.effects import CachePlan
from twin.host import SharedHost
from twin.shard import KvEvent, PoolShard
from twin.timing import TimingModel


@dataclass(slots=True)
class PrefillJob:
    request_id: str
    input_tokens: int
    keys: tuple[int, ...]
    plan: CachePlan
    source: "PrefillInstance | None" = None
    compute_s: float = 0.0  # filled in when it runs
    fetched_bytes: int = 0  # filled in when its fetch ends
    fetch_s: float = 0.0  # the fetch on the link, without waiting for the link's turn
    # Its turn on the worker: fetch and compute (what a live agent measures as its seconds,
    # there with the hand-off, which the twin sends after the turn).
    worked_s: float = 0.0


class PrefillInstance:
    """One prefill instance; callbacks carry its news back to the cluster driver."""

    def __init__(
        self,
        env: simpy.Environment,
        instance_id: str,
        timing: TimingModel,
        shard: PoolShard,
        *,
        block_size: int,
        chunk_tokens: int,
        on_kv_events: Callable[[list[KvEvent]], None],
        on_finished: Callable[[PrefillJob], None],
        host: SharedHost | None = None,
        on_started: Callable[[PrefillJob], None] | None = None,
    ) -> None:
        self.env = env
        self.instance_id = instance_id
        self.timing = timing
        self.shard = shard
        self.block_size = block_size
        self.chunk_tokens = chunk_tokens
        self.compute = simpy.Resource(env, capacity=1)
        self.link = simpy.Resource(env, capacity=1)
        self.group: list[PrefillInstance] = [self]
        self._on_started = on_started
        self._on_kv_events = on_kv_events
        self._on_finished = on_finished
        self.host = host

    def submit(self, job: PrefillJob) -> None:
        """Accept a dispatched job: pin what it reuses (and what it fetches), queue it."""
        self.shard.pin(job.plan.local_keys)
        fetch = job.plan.fetch
        if fetch is not None and job.source is not None:
            job.source.shard.pin(fetch.keys)
        self.env.process(self._run(job))

    def send(self, num_bytes: int) -> Generator[Any, Any, float]:
        """One transfer from this instance: its bytes occupy the outgoing link (one transfer's
        at a time, queued FIFO), its per-fetch latency (the call, both ends' threads) does
        not, so fetches' fixed costs overlap as live's concurrent ones do; returns the
        seconds of the transfer, its turn not counted."""
        seconds = self.timing.transfer_s(num_bytes)
        latency_s = min(self.timing.link_latency_s, seconds)
        with self.link.request() as turn:
            yield turn
            yield self.env.timeout(seconds - latency_s)
        yield self.env.timeout(latency_s)
        return seconds

    def _run(self, job: PrefillJob) -> Generator[Any, Any, None]:
        env = self.env
        is_pipelined = len(self.group) > 1 and job.input_tokens > self.chunk_tokens
        members = self.group if is_pipelined else [self]
        turns = [member.compute.request() for member in members]
        waited = not all(turn.triggered for turn in turns)  # behind another job
        for turn in turns:  # always in group order, so two pipelined jobs cannot deadlock
            yield turn
        if waited:  # the worker handed on from the job ahead, as a live agent's line does
            handover_s = self.timing.handover_delay_s()
            if handover_s > 0:
                yield env.timeout(handover_s)
        if self._on_started is not None:
            self._on_started(job)
        turn_s = env.now
        if job.plan.fetch is not None and job.source is not None:
            yield from self._fetch(job)  # on the worker's turn, as live fetches
        started_s = env.now
        solo_s = self._duration_s(job, num_stages=len(members))
        if self.host is None:
            yield env.timeout(solo_s)
        else:  # slowed while other instances compute on the same host
            yield from self.host.run(solo_s, self.timing.prefill_share(solo_s))
        job.compute_s = env.now - started_s
        job.worked_s = env.now - turn_s
        for member, turn in zip(members, turns, strict=True):
            member.compute.release(turn)
        now_s = env.now
        local_keys = job.plan.local_keys
        self.shard.touch(local_keys, now_s)
        self._on_kv_events(self.shard.store(job.keys, now_s))
        self.shard.unpin(local_keys)
        self._on_finished(job)

    def _fetch(self, job: PrefillJob) -> Generator[Any, Any, None]:
        fetch = job.plan.fetch
        source = job.source
        assert fetch is not None and source is not None
        num_bytes = len(fetch.keys) * self.block_size * self.timing.kv_bytes_per_token
        job.fetch_s = yield from source.send(num_bytes)
        job.fetched_bytes = num_bytes
        source.shard.unpin(fetch.keys)

    def _duration_s(self, job: PrefillJob, *, num_stages: int) -> float:
        timing = self.timing
        plan = job.plan
        compute_s = timing.prefill_s(job.input_tokens, plan.num_reused_tokens)
        block_bytes = self.block_size * timing.kv_bytes_per_token
        ssd_blocks = self.shard.count_on_ssd(plan.local_keys)
        dram_blocks = len(plan.local_keys) - ssd_blocks
        load_s = timing.load_s(dram_blocks * block_bytes, "dram") if dram_blocks else 0.0
        if ssd_blocks:
            load_s += timing.load_s(ssd_blocks * block_bytes, "ssd")
        seconds = max(compute_s, load_s)  # layer-wise loading overlaps compute
        if num_stages > 1:
            # C chunks through X stages, each stage 1/X of the layers: (C + X - 1) / (C X).
            chunks = math.ceil(job.input_tokens / self.chunk_tokens)
            seconds *= (chunks + num_stages - 1) / (chunks * num_stages)
        return seconds
