"""NodeAgent: one node's model, workers, pool shard and data plane, and what it does on
each control call. No gRPC here: `service` converts the wire messages.
"""

import json
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from agents.model import build_model
from agents.model.kv_blocks import block_to_bytes
from agents.model.registry import resolve_model
from agents.node import prefix as prefixes
from agents.node.decode_loop import DecodeLoop, Stream
from agents.node.faults import Faults, corrupting_last_block
from agents.node.handoff import HandoffInbox, blocks_as_tensors, push_kv
from agents.node.line import PrefillLine
from agents.node.prefix import PlanError
from agents.node.settings import AgentRole, AgentSettings
from agents.pool import CorruptBlock, KvEvent, KvPoolShard, ShardStats
from agents.transport import CorruptBlocksError, SourceBatch, TransportError, make_transport
from agents.workers import (
    BlockSource,
    DecodeRequest,
    DecodeWorker,
    PrefillWorker,
    SamplingParams,
    TokenLogprob,
    sample,
    token_logprob,
)
from backend.policy.blocks import block_keys
from backend.policy.calibration import DecodeStepSample, PrefillSample
from backend.policy.cost_model import CostModel
from backend.policy.effects import ArrivalCheck, CachePlan
from backend.rpc.reports import AgentLoad

DispatchError = PlanError
MAX_PREFILL_SAMPLES = 4096  # kept for the next heartbeat; the oldest go first
# Requests cancelled lately, remembered so that a dispatch arriving after its cancel (the two
# travel on different calls) is refused instead of run for nobody.
MAX_CANCELLED_IDS = 4096


@dataclass(frozen=True, slots=True)
class PrefillOutcome:
    request_id: str
    first_token: int
    num_tokens: int
    num_reused_tokens: int
    num_fetched_tokens: int
    recomputed_keys: tuple[int, ...]
    stored_keys: tuple[int, ...]
    events: tuple[KvEvent, ...]
    timings: dict[str, float]
    handed_off: bool
    logits: torch.Tensor | None
    first_logprob: TokenLogprob | None = None  # when the sampling asked for log-probabilities


class NodeAgent:
    """The parts of one agent; every public method is safe to call from gRPC threads."""

    def __init__(
        self, settings: AgentSettings, instance_id: str, faults: Faults = Faults()
    ) -> None:
        self.settings = settings
        self.instance_id = instance_id
        # New at every start: the Conductor tells a restart from a rejoin by it.
        self.incarnation = uuid.uuid4().hex
        self.role: AgentRole = settings.role
        self.model = build_model(settings.preset, seed=settings.seed)
        self.block_size = settings.block_size
        block_bytes = self.model.config.block_bytes(self.block_size, self.model.kv_dtype_bytes)
        self.shard = KvPoolShard(
            instance_id,
            block_bytes=block_bytes,
            dram_capacity_bytes=settings.dram_bytes,
            ssd_dir=settings.ssd_dir,
            ssd_capacity_bytes=settings.ssd_bytes,
        )
        self.cost_model = (
            CostModel.from_profile(json.loads(settings.profile.read_text()))
            if settings.profile is not None
            else None
        )
        # The arrival check of a dispatch without one of its own (an agent driven without a
        # Conductor, started with --tbt-slo); a Conductor's dispatch always says.
        self.own_check = (
            ArrivalCheck(settings.tbt_slo_s, self.cost_model.decode)
            if settings.tbt_slo_s is not None and self.cost_model is not None
            else None
        )
        self.prefill_worker = PrefillWorker(self.model, self.block_size)
        stops = resolve_model(settings.preset).stop_token_ids()
        worker = DecodeWorker(
            self.model, max_batch_size=settings.max_batch_size, stop_token_ids=stops
        )
        self.decode = DecodeLoop(worker)
        self.inbox = HandoffInbox(self.model, self.block_size)
        source = corrupting_last_block(self._serve) if faults.corrupt_fetch else self._serve
        self.transport = make_transport(
            settings.transport, secret=settings.secret, source=source, sink=self.inbox.put
        )
        self.data_address = self.transport.start(settings.data_listen)
        self._prefill_line = PrefillLine()  # one prefill at a time, in the Conductor's order
        self._state = threading.Condition()  # guards the counters and events below
        self._events: list[KvEvent] = []
        self._prefill_samples: deque[PrefillSample] = deque(maxlen=MAX_PREFILL_SAMPLES)
        self._num_in_flight = 0
        self._num_prefill_queued = 0
        self._num_prefill_running = 0
        self._queued_tokens = 0
        self._prefilling: set[str] = set()  # queued or running here
        self._cancelled: OrderedDict[str, str] = OrderedDict()  # request id -> reason
        self.draining = False

    def warm_up(self, max_tokens: int) -> float:
        """Compute random prompts of 64, 128, ... up to `max_tokens` tokens (nothing stored,
        nothing handed off), so the allocator holds the memory the longest prompts need
        before the first request comes; returns the seconds it took."""
        started_s = time.perf_counter()
        rng = np.random.default_rng(self.settings.seed)
        lengths = [n for n in (64 << k for k in range(16)) if n < max_tokens] + [max_tokens]
        for num_tokens in lengths:
            tokens = rng.integers(0, self.model.config.vocab_size, num_tokens)
            self.prefill_worker.prefill(tokens)
        return time.perf_counter() - started_s

    # -- admission of calls ------------------------------------------------------------
    def _enter(self, role: AgentRole | None) -> None:
        with self._state:
            if self.draining:
                raise PlanError("UNAVAILABLE", f"agent {self.instance_id} is draining")
            if role is not None and self.role != role:
                raise PlanError(
                    "FAILED_PRECONDITION", f"agent {self.instance_id} is a {self.role} agent"
                )
            self._num_in_flight += 1

    def _leave(self) -> None:
        with self._state:
            self._num_in_flight -= 1
            self._state.notify_all()

    def _record(self, events: Sequence[KvEvent]) -> None:
        with self._state:
            self._events.extend(events)

    # -- prefill -------------------------------------------------------------------------
    def prefill(
        self,
        request_id: str,
        token_ids: Sequence[int],
        plan: CachePlan,
        fetch_address: str | None,
        *,
        replicate: bool = False,
        decode_address: str = "",
        sampling: SamplingParams = SamplingParams(),
        return_logits: bool = False,
        line_position: int = 0,
    ) -> PrefillOutcome:
        """Run one prefill when its turn comes: the waiting ones go by `line_position`
        (their place in the Conductor's line; 0: first come first served)."""
        if not request_id:
            raise PlanError("INVALID_ARGUMENT", "a request id is required")
        tokens = np.asarray(token_ids, dtype=np.int64)
        vocab = self.model.config.vocab_size
        if tokens.size == 0 or tokens.min() < 0 or tokens.max() >= vocab:
            raise PlanError("INVALID_ARGUMENT", f"token ids must be non-empty and in [0, {vocab})")
        self._enter("prefill")
        try:
            with self._state:
                self._refuse_if_cancelled(request_id)
                self._prefilling.add(request_id)
                self._num_prefill_queued += 1
                self._queued_tokens += tokens.size
            queued_s = time.perf_counter()
            try:
                with self._prefill_line.turn(line_position) as turn:
                    with self._state:
                        self._num_prefill_queued -= 1
                        self._num_prefill_running += 1
                    try:
                        with self._state:  # cancelled while it queued: nothing was done
                            self._refuse_if_cancelled(request_id)
                        outcome = self._prefill(
                            request_id, tokens, plan, fetch_address, replicate,
                            decode_address, sampling, return_logits,
                            time.perf_counter() - queued_s,
                        )  # fmt: skip
                        self._measured(outcome, turn.handover_s)
                        return outcome
                    finally:
                        with self._state:
                            self._num_prefill_running -= 1
            finally:
                with self._state:
                    self._queued_tokens -= tokens.size
                    self._prefilling.discard(request_id)
        finally:
            self._leave()

    def _refuse_if_cancelled(self, request_id: str) -> None:
        """Under `_state`: CANCELLED if the Conductor cancelled this request already."""
        reason = self._cancelled.get(request_id)
        if reason is not None:
            raise PlanError("CANCELLED", f"request {request_id} was cancelled ({reason})")

    def _prefill(
        self,
        request_id: str,
        tokens: np.ndarray,
        plan: CachePlan,
        fetch_address: str | None,
        replicate: bool,
        decode_address: str,
        sampling: SamplingParams,
        return_logits: bool,
        queue_s: float,
    ) -> PrefillOutcome:
        started_s, started_cpu_s = time.perf_counter(), time.thread_time()
        now_s = time.time()
        prompt_keys = block_keys(tokens.astype(np.int32), self.block_size)
        prefix = prefixes.gather(
            self.shard, self.transport, plan, fetch_address, prompt_keys, now_s
        )
        events = list(prefix.events)
        try:
            blocks = blocks_as_tensors(prefix.blocks, self.model, self.block_size)
            source = BlockSource(blocks) if blocks else None
            compute_started_s = time.perf_counter()
            result = self.prefill_worker.prefill(tokens, source=source)
            compute_s = time.perf_counter() - compute_started_s
            store_started_s = time.perf_counter()
            stored: list[int] = []
            num_local = len(prefix.keys) - prefix.num_fetched
            if replicate and prefix.num_fetched:
                fetched_keys = prefix.keys[num_local:]
                kept = self.shard.store(fetched_keys, prefix.blocks[num_local:], now_s, num_local)
                events.extend(kept.events)
                stored.extend(k for k in fetched_keys if k not in kept.refused_keys)
            if result.new_block_keys:
                new = self.shard.store(
                    result.new_block_keys,
                    [block_to_bytes(block) for block in result.new_blocks],
                    now_s,
                    result.num_cached_tokens // self.block_size,
                )
                events.extend(new.events)
                stored.extend(k for k in result.new_block_keys if k not in new.refused_keys)
            store_s = time.perf_counter() - store_started_s
        finally:
            if prefix.pinned:
                self.shard.unpin(prefix.pinned)
        self._record(events)  # the blocks it stored stay useful, cancelled or not
        with self._state:  # cancelled while it ran: no hand-off
            self._refuse_if_cancelled(request_id)
        first_token = sample(result.logits, sampling, sampling.generator())
        first_logprob = token_logprob(result.logits, first_token, sampling)
        handoff_started_s = time.perf_counter()
        if decode_address:
            try:
                push_kv(
                    self.transport, decode_address, request_id, result.paged_kv(self.block_size)
                )
            except (TransportError, OSError) as error:
                # ABORTED, not UNAVAILABLE: this agent is fine, the decode side is not, and
                # the Conductor takes UNAVAILABLE to mean the agent it called is gone.
                message = f"KV hand-off to {decode_address} failed: {error}"
                raise PlanError("ABORTED", message) from error
        handoff_s = time.perf_counter() - handoff_started_s
        return PrefillOutcome(
            request_id=request_id,
            first_token=first_token,
            num_tokens=result.num_tokens,
            num_reused_tokens=result.num_cached_tokens,
            num_fetched_tokens=prefix.num_fetched * self.block_size,
            recomputed_keys=tuple(prefix.recomputed_keys),
            stored_keys=tuple(dict.fromkeys(stored)),
            events=tuple(events),
            timings={
                "queue_s": queue_s,
                "load_s": prefix.load_s,
                "fetch_s": prefix.fetch_s,
                "compute_s": compute_s,
                "load_wait_s": result.timings.load_wait_s,
                "store_wait_s": result.timings.store_wait_s,
                "store_s": store_s,
                "handoff_s": handoff_s,
                "total_s": queue_s + time.perf_counter() - started_s,
                # Its wall clock as its work on the prefill ended: all after it (the events'
                # flush, the answer, its way back) is the answer's way to the Conductor.
                "ended_unix_s": time.time(),
                # This thread does all of the work above (loads and stores run inline).
                "cpu_s": time.thread_time() - started_cpu_s,
            },
            handed_off=bool(decode_address),
            logits=result.logits if return_logits else None,
            first_logprob=first_logprob,
        )

    def _measured(self, outcome: PrefillOutcome, handover_s: float | None) -> None:
        """Keep the prefill's measurement for the Conductor's calibration (`handover_s`:
        the line's hand-over to it, None where it found the worker free)."""
        timings = outcome.timings
        sample = PrefillSample(
            time_s=time.time(),
            input_tokens=outcome.num_tokens,
            cached_tokens=outcome.num_reused_tokens,
            seconds=timings["total_s"] - timings["queue_s"],
            queue_s=timings["queue_s"],
            fetched_tokens=outcome.num_fetched_tokens,
            cpu_s=min(timings["cpu_s"], timings["total_s"] - timings["queue_s"]),
            fetch_s=timings["fetch_s"],
            handover_s=handover_s,
        )
        with self._state:
            self._prefill_samples.append(sample)

    def take_samples(self) -> tuple[list[PrefillSample], list[DecodeStepSample]]:
        """The prefills and decode steps measured since the last call (for a heartbeat)."""
        with self._state:
            prefills = list(self._prefill_samples)
            self._prefill_samples.clear()
        return prefills, self.decode.take_steps()

    # -- decode --------------------------------------------------------------------------
    def start_decode(
        self,
        request_id: str,
        num_context_tokens: int,
        first_token: int,
        max_tokens: int,
        sampling: SamplingParams = SamplingParams(),
        arrival_check: ArrivalCheck | None = None,
        *,
        dispatch_decides: bool = False,
    ) -> Stream:
        """Admit the handed-off request; the caller must call `finish_decode` after.

        `dispatch_decides`: the dispatch carried the arrival check to run (`arrival_check`,
        None for none); otherwise the agent's own (`--tbt-slo`) applies."""
        check = arrival_check if dispatch_decides else self.own_check
        if max_tokens < 1 or num_context_tokens < 1:
            raise PlanError("INVALID_ARGUMENT", "max_tokens and num_context_tokens must be >= 1")
        self._enter("decode")
        try:
            with self._state:
                self._refuse_if_cancelled(request_id)
            try:
                kv = self.inbox.take(request_id, num_context_tokens)
            except KeyError as missing:
                raise PlanError("FAILED_PRECONDITION", str(missing.args[0])) from None
            except ValueError as bad:
                raise PlanError("INVALID_ARGUMENT", f"handed-off KV does not fit: {bad}") from None
            request = DecodeRequest(request_id, kv, first_token, max_tokens, sampling, check)
            try:
                return self.decode.submit(request)
            except ValueError as bad:
                raise PlanError("INVALID_ARGUMENT", str(bad)) from None
        except BaseException:
            self._leave()
            raise

    def finish_decode(self) -> None:
        self._leave()

    # -- cancellation ----------------------------------------------------------------------
    def cancel(self, request_id: str, reason: str) -> str:
        """Drop the request wherever it stands here; returns where ("prefill": it stops
        before its compute or its hand-off, "handoff": its pushed KV is freed, "decode": its
        batch slot is free from the next step) or "" when this agent does not hold it."""
        with self._state:
            self._cancelled[request_id] = reason
            while len(self._cancelled) > MAX_CANCELLED_IDS:
                self._cancelled.popitem(last=False)
            in_prefill = request_id in self._prefilling
        if self.decode.cancel(request_id, reason):
            return "decode"
        if self.inbox.drop(request_id):
            return "handoff"
        return "prefill" if in_prefill else ""

    # -- pool operations -----------------------------------------------------------------
    def replicate(
        self, source_address: str, keys: Sequence[int], first_depth: int
    ) -> tuple[list[int], list[int], str, list[KvEvent]]:
        """Fetch `keys` from a peer and keep them: (stored, failed, error, events)."""
        self._enter(None)
        try:
            try:
                blocks = self.transport.fetch(source_address, keys)
            except TransportError as error:
                return [], list(keys), str(error), []
            result = self.shard.store(keys, blocks, time.time(), first_depth)
            self._record(result.events)
            stored = [k for k in keys if k not in result.refused_keys]
            return stored, list(result.refused_keys), "", result.events
        finally:
            self._leave()

    def evict(self, keys: Sequence[int]) -> list[KvEvent]:
        events = self.shard.evict(keys, time.time())
        self._record(events)
        return events

    def _serve(self, keys: Sequence[int]) -> SourceBatch:
        """The transport's block source: the shard's blocks, pinned until sent."""
        keys = tuple(keys)
        self.shard.pin(keys)
        try:
            loaded = self.shard.load(keys, time.time())
            checksums = [self.shard.checksum_of(key) for key in keys]
        except CorruptBlock as corrupt:  # dropped here: tell the Conductor and the requester
            self.shard.unpin(keys)
            self._record(corrupt.events)
            raise CorruptBlocksError(corrupt.keys) from None
        except BaseException:
            self.shard.unpin(keys)
            raise
        self._record(loaded.events)
        return SourceBatch(loaded.blocks, checksums, lambda: self.shard.unpin(keys))

    # -- role, drain, state ----------------------------------------------------------------
    def set_role(self, role: AgentRole) -> AgentRole:
        """Serve as `role` from now on, ending a drain; a switch needs no call in flight."""
        with self._state:
            if role != self.role and self._num_in_flight:
                raise PlanError(
                    "FAILED_PRECONDITION",
                    f"agent {self.instance_id} has {self._num_in_flight} call(s) in flight; "
                    "drain it before switching its role",
                )
            self.role = role
            self.draining = False
            return role

    def drain(self, timeout_s: float | None) -> tuple[bool, int]:
        """Refuse new work and wait for in-flight calls: (drained, calls still in flight)."""
        with self._state:
            self.draining = True
            self._state.wait_for(lambda: self._num_in_flight == 0, timeout_s)
            return self._num_in_flight == 0, self._num_in_flight

    def take_events(self) -> list[KvEvent]:
        with self._state:
            events, self._events = self._events, []
            return events

    def load(self) -> dict[str, float | int]:
        batch_size, context_tokens = self.decode.load()
        if self.cost_model is not None:
            predicted = self.cost_model.decode_step_time_s(batch_size, context_tokens)
        else:
            predicted = self.decode.last_step_s if batch_size else 0.0
        with self._state:
            return {
                "num_queued": self._num_prefill_queued,
                "num_running": self._num_prefill_running,
                "queued_tokens": self._queued_tokens,
                "batch_size": batch_size,
                "context_tokens": context_tokens,
                "predicted_tbt_s": predicted,
                "last_step_s": self.decode.last_step_s,
            }

    def report_load(self) -> AgentLoad:
        """The load GetState and heartbeats report: queue, batch, predicted TBT, memory."""
        load, stats = self.load(), self.stats()
        block_bytes = self.shard.block_bytes
        return AgentLoad(
            num_queued=int(load["num_queued"]),
            num_running=int(load["num_running"]),
            queued_tokens=int(load["queued_tokens"]),
            batch_size=int(load["batch_size"]),
            context_tokens=int(load["context_tokens"]),
            predicted_tbt_s=float(load["predicted_tbt_s"]),
            tbt_slo_s=self.own_check.tbt_slo_s if self.own_check is not None else 0.0,
            last_step_s=float(load["last_step_s"]),
            dram_bytes=stats.dram_bytes,
            dram_capacity_bytes=stats.dram_capacity_blocks * block_bytes,
            ssd_bytes=stats.ssd_bytes,
            ssd_capacity_bytes=stats.ssd_capacity_blocks * block_bytes,
            num_dram_blocks=stats.num_dram_blocks,
            num_ssd_blocks=stats.num_ssd_blocks,
            num_pinned_keys=stats.num_pinned_keys,
            num_pending_handoffs=len(self.inbox),
        )

    @property
    def kv_capacity_tokens(self) -> int:
        stats = self.stats()
        return (stats.dram_capacity_blocks + stats.ssd_capacity_blocks) * self.block_size

    def stats(self) -> ShardStats:
        return self.shard.stats()

    def close(self) -> None:
        self.decode.stop()
        self.transport.close()
