"""The policy replay benchmark: a trace through ConductorCore with no I/O, each call timed.

A tiny heapq event loop plays the cluster around the core. Prefill instances run their
queues FIFO, each request for the core's own transfer + prefill estimate, then store all of
the request's full blocks in an LRU BlockCache whose evictions go back as KvEvicted, so the
prefix index stays as full as a live one. Decode instances run a request for
`output_length` steps of their batch's step time at its start. Only time spent inside
`core.handle` is charged to the core; the rest is the driver's.
"""

import gc
import heapq
import itertools
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from backend.policy import events as ev
from backend.policy.block_cache import BlockCache
from backend.policy.config import PolicyConfig
from backend.policy.core import ConductorCore
from backend.policy.cost_model import CostModel
from backend.policy.decode_load import check_decode_arrival
from backend.policy.effects import DispatchDecode, DispatchPrefill, Effect, Reject, Replicate
from backend.traces.arrivals import arrivals_from_rows
from backend.traces.loader import TraceRow

DEFAULT_CACHE_CAPACITY_BLOCKS = 100_000
# How many arrivals pass between two progress callbacks (called outside the timed calls).
_PROGRESS_EVERY = 128


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """Counts and timings of one replay; latencies are of RequestArrived handling."""

    scheduler: str
    rejection_policy: str
    num_prefill_instances: int
    num_decode_instances: int
    num_requests: int
    num_accepted: int
    num_completed: int
    num_rejected: int
    rejected_by_reason: dict[str, int]
    num_in_flight_at_end: int
    num_core_events: int
    core_s: float
    core_s_by_event: dict[str, float]
    wall_s: float
    simulated_s: float
    decisions_per_s: float
    p50_us: float
    p99_us: float
    max_us: float
    cache_hit_ratio: float

    @property
    def driver_s(self) -> float:
        """Wall time of the replay spent outside `core.handle` (the event loop, the caches)."""
        return self.wall_s - self.core_s

    @property
    def is_drained(self) -> bool:
        """Whether every request ended (completed or rejected) and the core tracks none."""
        return (
            self.num_completed + self.num_rejected == self.num_requests
            and self.num_in_flight_at_end == 0
        )


@dataclass(slots=True)
class _PrefillWorker:
    """A prefill instance: FIFO queue of (request_id, seconds) and its pool shard."""

    instance_id: str
    cache: BlockCache
    queue: deque[tuple[str, float]] = field(default_factory=deque)
    is_busy: bool = False


@dataclass(slots=True)
class _DecodeWorker:
    """A decode instance: its running batch as request_id -> context tokens."""

    instance_id: str
    batch: dict[str, int] = field(default_factory=dict)
    context_tokens: int = 0


class PolicyReplay:
    """One cluster of fake instances around `core`; `run` replays arrivals to the end."""

    def __init__(
        self,
        core: ConductorCore,
        *,
        num_prefill_instances: int,
        num_decode_instances: int,
        cache_capacity_blocks: int = DEFAULT_CACHE_CAPACITY_BLOCKS,
    ) -> None:
        self.core = core
        self.prefill = {
            f"prefill-{i:02d}": _PrefillWorker(
                f"prefill-{i:02d}", BlockCache(cache_capacity_blocks, core.config.eviction_policy)
            )
            for i in range(num_prefill_instances)
        }
        self.decode = {
            f"decode-{i:02d}": _DecodeWorker(f"decode-{i:02d}") for i in range(num_decode_instances)
        }
        self._pending: list[tuple[float, int, ev.Event]] = []
        self._sequence = itertools.count()
        self._arrivals: dict[str, ev.RequestArrived] = {}
        self._decoding_on: dict[str, _DecodeWorker] = {}
        self._arrival_ns: list[int] = []
        self._core_ns = 0
        self._core_ns_by_event: Counter[str] = Counter()
        self._num_core_events = 0
        self._num_accepted = 0
        self._num_completed = 0
        self._rejections: Counter[str] = Counter()
        self._num_reused_tokens = 0
        self._num_accepted_input_tokens = 0

    # -- the loop -------------------------------------------------------------------------
    def run(
        self,
        arrivals: Sequence[ev.RequestArrived],
        on_progress: Callable[[int], None] | None = None,
    ) -> ReplayResult:
        """Feed `arrivals` and every completion they cause; returns when nothing is pending."""
        # Long-lived objects (the arrivals) leave the garbage collector's generations, as a
        # long-running Conductor would do after start-up; otherwise a full collection pauses
        # one decision for ~30 ms.
        gc.collect()
        gc.freeze()
        started_s = time.perf_counter()
        for instance_id in self.prefill:
            self._feed(ev.AgentJoined(0.0, instance_id, "prefill"))
        for instance_id in self.decode:
            self._feed(ev.AgentJoined(0.0, instance_id, "decode"))
        for arrival in arrivals:
            self._schedule(arrival)
        now_s = 0.0
        num_arrived = 0
        while self._pending:
            now_s, _, event = heapq.heappop(self._pending)
            kind = type(event)
            if kind is ev.RequestArrived:
                self._on_arrival(event)
                num_arrived += 1
                if on_progress is not None and num_arrived % _PROGRESS_EVERY == 0:
                    on_progress(_PROGRESS_EVERY)
            elif kind is ev.PrefillFinished:
                self._on_prefill_end(event)
            elif kind is ev.DecodeFinished:
                self._on_decode_end(event)
        if on_progress is not None and num_arrived % _PROGRESS_EVERY:
            on_progress(num_arrived % _PROGRESS_EVERY)
        wall_s = time.perf_counter() - started_s
        return self._result(len(arrivals), wall_s, now_s)

    def _schedule(self, event: ev.Event) -> None:
        heapq.heappush(self._pending, (event.now_s, next(self._sequence), event))

    def _feed(self, event: ev.Event) -> tuple[Effect, ...]:
        started_ns = time.perf_counter_ns()
        effects = self.core.handle(event)
        elapsed_ns = time.perf_counter_ns() - started_ns
        self._core_ns += elapsed_ns
        self._num_core_events += 1
        self._core_ns_by_event[type(event).__name__] += elapsed_ns
        if type(event) is ev.RequestArrived:
            self._arrival_ns.append(elapsed_ns)
        return effects

    # -- what the fake instances do -------------------------------------------------------
    def _on_arrival(self, arrival: ev.RequestArrived) -> None:
        self._arrivals[arrival.request_id] = arrival
        for effect in self._feed(arrival):
            if type(effect) is DispatchPrefill:
                self._num_accepted += 1
                self._num_reused_tokens += effect.plan.num_reused_tokens
                self._num_accepted_input_tokens += arrival.num_input_tokens
                worker = self.prefill[effect.instance_id]
                busy_s = effect.estimated_transfer_s + effect.estimated_prefill_s
                worker.queue.append((effect.request_id, busy_s))
                if not worker.is_busy:
                    self._start_next_prefill(worker, arrival.now_s)
            elif type(effect) is Reject:
                self._rejections[f"{effect.stage}:{effect.reason}"] += 1
                del self._arrivals[effect.request_id]
            elif type(effect) is not Replicate:
                # Replicate needs no action: the fetched keys reach the target's shard with
                # the KvStored sent when the prefill ends.
                raise RuntimeError(f"the replay cannot carry out {effect!r}")

    def _start_next_prefill(self, worker: _PrefillWorker, now_s: float) -> None:
        if not worker.queue:
            worker.is_busy = False
            return
        request_id, busy_s = worker.queue.popleft()
        worker.is_busy = True
        self._feed(ev.PrefillStarted(now_s, request_id, worker.instance_id))
        self._schedule(ev.PrefillFinished(now_s + busy_s, request_id, worker.instance_id))

    def _on_prefill_end(self, event: ev.PrefillFinished) -> None:
        worker = self.prefill[event.instance_id]
        keys = self._arrivals[event.request_id].block_keys
        for effect in self._feed(event):
            if type(effect) is not DispatchDecode:
                raise RuntimeError(f"the replay cannot carry out {effect!r}")
            self._start_decode(effect, event.now_s)
        self._store_kv(worker, keys, event.now_s)
        self._start_next_prefill(worker, event.now_s)

    def _store_kv(self, worker: _PrefillWorker, keys: Sequence[int], now_s: float) -> None:
        """Insert the request's blocks in the shard and tell the core what changed."""
        cache = worker.cache
        evicted = cache.insert_blocks(keys, now_s).evicted  # never the request's own keys
        if evicted:
            self._feed(ev.KvEvicted(now_s, worker.instance_id, tuple(evicted)))
        held = tuple(key for key in keys if key in cache)
        if held:
            self._feed(ev.KvStored(now_s, worker.instance_id, held))

    def _start_decode(self, dispatch: DispatchDecode, now_s: float) -> None:
        worker = self.decode[dispatch.instance_id]
        arrival = self._arrivals[dispatch.request_id]
        cost = self.core.cost
        if dispatch.arrival_check is not None:
            reason = check_decode_arrival(
                dispatch.arrival_check,
                batch_size=len(worker.batch),
                context_tokens=worker.context_tokens,
                new_context_tokens=dispatch.num_context_tokens,
            )
            if reason is not None:
                self._feed(
                    ev.DecodeRejected(now_s, dispatch.request_id, worker.instance_id, reason)
                )
                self._rejections[f"decode:{reason}"] += 1
                del self._arrivals[dispatch.request_id]
                return
        self._feed(ev.DecodeStarted(now_s, dispatch.request_id, worker.instance_id))
        worker.batch[dispatch.request_id] = dispatch.num_context_tokens
        worker.context_tokens += dispatch.num_context_tokens
        step_s = cost.decode_step_time_s(len(worker.batch), worker.context_tokens)
        self._decoding_on[dispatch.request_id] = worker
        self._schedule(
            ev.DecodeFinished(now_s + arrival.num_output_tokens * step_s, dispatch.request_id)
        )

    def _on_decode_end(self, event: ev.DecodeFinished) -> None:
        self._feed(event)
        worker = self._decoding_on.pop(event.request_id)
        worker.context_tokens -= worker.batch.pop(event.request_id)
        del self._arrivals[event.request_id]
        self._num_completed += 1

    # -- the figures ----------------------------------------------------------------------
    def _result(self, num_requests: int, wall_s: float, simulated_s: float) -> ReplayResult:
        arrival_us = np.array(self._arrival_ns, dtype=np.float64) / 1000.0
        core_s = self._core_ns / 1e9
        p50_us, p99_us = (
            (float(v) for v in np.percentile(arrival_us, [50, 99])) if len(arrival_us) else (0, 0)
        )
        return ReplayResult(
            scheduler=self.core.config.prefill_scheduler,
            rejection_policy=self.core.config.rejection_policy,
            num_prefill_instances=len(self.prefill),
            num_decode_instances=len(self.decode),
            num_requests=num_requests,
            num_accepted=self._num_accepted,
            num_completed=self._num_completed,
            num_rejected=sum(self._rejections.values()),
            rejected_by_reason=dict(sorted(self._rejections.items())),
            num_in_flight_at_end=self.core.num_in_flight,
            num_core_events=self._num_core_events,
            core_s=core_s,
            core_s_by_event={name: ns / 1e9 for name, ns in self._core_ns_by_event.most_common()},
            wall_s=wall_s,
            simulated_s=simulated_s,
            decisions_per_s=len(arrival_us) / core_s if core_s > 0 else 0.0,
            p50_us=p50_us,
            p99_us=p99_us,
            max_us=float(arrival_us.max()) if len(arrival_us) else 0.0,
            cache_hit_ratio=(
                self._num_reused_tokens / self._num_accepted_input_tokens
                if self._num_accepted_input_tokens
                else 0.0
            ),
        )


def replay_trace(
    rows: Sequence[TraceRow],
    *,
    num_prefill_instances: int,
    num_decode_instances: int,
    scheduler: str = "kvcache-centric",
    rejection_policy: str = "early-predicted",
    block_size: int = 512,
    cache_capacity_blocks: int = DEFAULT_CACHE_CAPACITY_BLOCKS,
    on_progress: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Replay `rows` through a fresh core built for the reference LLaMA2-70B cost model."""
    config = PolicyConfig(
        block_size=block_size, prefill_scheduler=scheduler, rejection_policy=rejection_policy
    )
    replay = PolicyReplay(
        ConductorCore(config, CostModel.reference_70b()),
        num_prefill_instances=num_prefill_instances,
        num_decode_instances=num_decode_instances,
        cache_capacity_blocks=cache_capacity_blocks,
    )
    return replay.run(arrivals_from_rows(rows, block_size=block_size), on_progress)
