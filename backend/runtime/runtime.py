"""ConductorRuntime: the live driver of the policy core.

One lock owns the core: every event is fed, and the in-memory part of its effects carried
out, while holding it. Agent RPCs run outside the lock on a thread pool, one worker per
request from dispatch to its last token. The request log (arrivals, decisions, outcomes) is
queued under the lock, in the core's order, and written behind in batches by
`backend.db.writer.RequestLogWriter`; readers that must see it call `flush_records()`.
Time comes from an injected clock.
"""

import contextlib
import dataclasses
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from sqlalchemy.orm import Session, sessionmaker

from backend.db import calibration_store, cluster_log, request_log
from backend.db.records import LoadSample, RequestOutcome
from backend.db.writer import RecordNotAccepted, RequestLogWriter
from backend.metrics import ConductorMetrics
from backend.observe.measures import gap_histogram
from backend.policy import ConductorCore, CostModel, PolicyConfig, block_keys
from backend.policy import events as ev
from backend.policy.calibration import Calibrator, ServingSample
from backend.policy.effects import (
    DispatchDecode,
    DispatchPrefill,
    Effect,
    EffectHandler,
    Evict,
    FailRequest,
    Reject,
    Replicate,
    carry_out,
)
from backend.rpc import agent_pb2 as pb
from backend.rpc import agent_pb2_grpc as pb_grpc
from backend.rpc.auth import SecretInterceptor, call_metadata
from backend.rpc.convert import (
    dispatch_decode_to_proto,
    dispatch_prefill_to_proto,
    evict_to_proto,
    role_to_proto,
)
from backend.rpc.reports import AgentLoad, Heartbeat, Join
from backend.runtime.hotspots import BlockHits
from backend.runtime.requests import Logprob, RequestStream, Sampling
from backend.runtime.roles import RoleSwitchRefused, wait_until_idle
from backend.runtime.sampler import LoadSampler
from backend.runtime.service import ConductorService
from backend.settings.conductor import ConductorSettings

logger = logging.getLogger(__name__)


class RequestLogUnavailable(RuntimeError):
    """The request log cannot take a new request (its writer is stopped or far behind a
    failing database): the request is refused before admission, so none goes unrecorded."""


@dataclass(eq=False)
class AgentInfo:
    """A joined agent: its addresses, a stub to its Agent service, its last report."""

    join: Join
    last_seen_s: float
    channel: grpc.Channel
    stub: pb_grpc.AgentStub
    load: AgentLoad = field(default_factory=AgentLoad)
    # Our clock minus the agent's, as the least gap seen between a heartbeat's stamp and its
    # arrival (its delivery delay varies, by up to 0.1 s on a busy Conductor).
    clock_offset_s: float = math.inf
    draining: bool = False  # takes no new work (a role switch is under way)


class ConductorRuntime(EffectHandler):
    """Serves Join/Heartbeat, admits and runs requests, detects dead agents; see module doc."""

    def __init__(
        self,
        settings: ConductorSettings,
        cost: CostModel,
        *,
        clock: Callable[[], float] = time.monotonic,
        session_factory: sessionmaker[Session] | None = None,
        grpc_address: str | None = None,
        max_finished_requests: int = 10_000,
    ) -> None:
        assert settings.agent_secret is not None, "the runtime needs the agents' secret"
        self.config = settings.policy_config()
        self.core = ConductorCore(self.config, cost)
        # The cost model refitted from what the agents measure (heartbeats) and what this
        # runtime measures of the serving path; `calibrate` off: measured, never applied.
        self.calibrator = Calibrator(cost, settings.calibration_config())
        self.calibrate = settings.calibrate
        self.metrics: ConductorMetrics | None = None
        self.heartbeat_interval_s = settings.heartbeat_interval_s
        self.heartbeat_timeout_s = settings.heartbeat_timeout_s
        self.request_deadline_s = settings.request_deadline_s
        self._secret = settings.agent_secret.get_secret_value()
        self._metadata = call_metadata(self._secret)
        self._clock = clock
        self._sessions = session_factory
        # Arrivals, decisions and outcomes are written behind the serving path, in batches;
        # they are queued under the lock, in the order the core produced them.
        self._log = (
            RequestLogWriter(session_factory, put_timeout_s=0).start()
            if session_factory is not None
            else None
        )
        self._address = grpc_address or f"{settings.grpc_host}:{settings.grpc_port}"
        self._lock = threading.Lock()
        self._work_after: list[Callable[[], None]] = []  # see _apply
        self._agents: dict[str, AgentInfo] = {}
        self._requests: dict[str, RequestStream] = {}
        self._open: dict[str, float] = {}  # unfinished request id -> arrival, oldest first
        # Finished requests stay readable (request()) until this many newer ones finished.
        self._finished: deque[str] = deque()
        self.max_finished_requests = max_finished_requests
        self._left: dict[str, str] = {}  # instance id -> why it left
        # An agent prefills one request at a time, in the order they reach it: a request
        # dispatched to it waits in its line and starts, in the core's view, when the one
        # before it there ends (as a twin prefill instance starts its next job). Fed at
        # dispatch instead, every request would seem to run at once and the core's T_queue
        # would miss the agent's backlog.
        self._prefill_lines: dict[str, deque[str]] = {}
        self.hits = BlockHits()
        self._sampler = (
            LoadSampler(
                self.sample_loads, session_factory, interval_s=settings.load_sample_interval_s
            )
            if session_factory is not None
            else None
        )
        # One thread per request from dispatch to its last token: as many as admission lets
        # be in flight (max_in_flight_requests), so the pool itself is never a hidden queue.
        self._pool_size = self.config.max_in_flight_requests
        self._pool = futures.ThreadPoolExecutor(self._pool_size, thread_name_prefix="runtime")
        # Cancel calls to agents, off the caller's thread (the API's event loop cancels).
        self._cancels = futures.ThreadPoolExecutor(2, thread_name_prefix="runtime-cancel")
        self._server: grpc.Server | None = None
        self._stopping = threading.Event()
        self._monitor: threading.Thread | None = None
        self.port = 0
        if session_factory is not None:
            self._end_previous_requests()
            self._restore_calibration()

    # -- life ------------------------------------------------------------------------------
    @property
    def address(self) -> str:
        host = self._address.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    def start(self, *, watch: bool = True) -> "ConductorRuntime":
        """Serve the Conductor service; `watch`: check heartbeats periodically (else call
        `check_heartbeats()` yourself)."""
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="conductor-rpc"),
            interceptors=[SecretInterceptor(self._secret)],
            options=[("grpc.so_reuseport", 0)],
        )
        pb_grpc.add_ConductorServicer_to_server(ConductorService(self), server)
        self.port = server.add_insecure_port(self._address)
        server.start()
        self._server = server
        if watch:
            self._monitor = threading.Thread(
                target=self._watch, name="heartbeat-monitor", daemon=True
            )
            self._monitor.start()
            if self._sampler is not None:
                self._sampler.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._sampler is not None:
            self._sampler.stop()
        if self._server is not None:
            self._server.stop(grace=0).wait()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._cancels.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            agents = list(self._agents.values())
        for agent in agents:
            agent.channel.close()
        if self._log is not None and not self._log.stop():
            logger.error("the request log lost records at stop: %s", self._log.stats)

    def flush_records(self, timeout_s: float | None = 10.0) -> bool:
        """Wait until every arrival, decision and outcome so far is in the database (readers
        that must see them call this first); False when `timeout_s` passed first."""
        return self._log.flush(timeout_s) if self._log is not None else True

    def attach_metrics(self, metrics: ConductorMetrics) -> None:
        """Record decisions and replications in `metrics` (the app's /metrics registry)."""
        self.metrics = metrics

    def reconfigure(self, config: PolicyConfig) -> None:
        """Apply a new policy configuration to the running core (between two events)."""
        if config.block_size != self.config.block_size:
            raise ValueError("block_size cannot change while agents are joined with it")
        if config.max_in_flight_requests > self._pool_size:
            raise ValueError(
                f"max_in_flight_requests can rise to {self._pool_size} (the limit this Conductor "
                "started with) without a restart"
            )
        with self._lock:
            self.core.reconfigure(config)
            self.config = config

    def now_s(self) -> float:
        """The runtime's clock, the one heartbeats and events are stamped with."""
        return self._clock()

    def locked(self) -> threading.Lock:
        """The lock that owns the core: hold it (`with runtime.locked():`) to read the core's
        index or queues consistently from another thread."""
        return self._lock

    def agents(self) -> dict[str, AgentInfo]:
        with self._lock:
            return dict(self._agents)

    def missing_roles(self) -> list[str]:
        """The roles ("prefill", "decode") with no instance taking requests now: a request
        would be refused until one joins (or ends its drain). Empty when it can serve."""
        with self._lock:
            serving = {
                "prefill": any(not s.draining for s in self.core.prefill.values()),
                "decode": any(not s.draining for s in self.core.decode.values()),
            }
        return [role for role, present in serving.items() if not present]

    def agents_locked(self) -> list[AgentInfo]:
        """The joined agents, for a caller holding `locked()`."""
        return list(self._agents.values())

    def left(self) -> dict[str, str]:
        """Instances that left, and why."""
        with self._lock:
            return dict(self._left)

    def sample_loads(self) -> tuple[list[LoadSample], dict[str, float]]:
        """Every joined instance's load now (see LoadSampler), and when each was last seen."""
        with self._lock:
            now_s = self._clock()
            decode_loads = self.core.decode_loads()
            samples = []
            for instance_id, info in self._agents.items():
                prefill = self.core.prefill.get(instance_id)
                load = info.load
                samples.append(
                    LoadSample(
                        time_s=now_s,
                        instance_id=instance_id,
                        prefill_load_s=prefill.queue_s(now_s) if prefill is not None else None,
                        decode_load=decode_loads.get(instance_id),
                        memory_used_bytes=load.dram_bytes + load.ssd_bytes,
                        memory_capacity_bytes=load.dram_capacity_bytes + load.ssd_capacity_bytes,
                    )
                )
            seen = {instance_id: info.last_seen_s for instance_id, info in self._agents.items()}
            roles = {instance_id: info.join.role for instance_id, info in self._agents.items()}
            ttft_slo_s, tbt_slo_s = self.config.ttft_slo_s, self.config.tbt_slo_s
            links = self.core.links.snapshot()
        if self.metrics is not None:
            self.metrics.set_links(links)
            loads = {
                (s.instance_id, roles[s.instance_id]): (
                    s.prefill_load_s / ttft_slo_s if s.prefill_load_s is not None else s.decode_load
                )
                for s in samples
            }
            self.metrics.set_pool_sample(
                {key: load for key, load in loads.items() if load is not None},
                {(i, roles[i]): max(0.0, now_s - seen_s) for i, seen_s in seen.items()},
                ttft_slo_s=ttft_slo_s,
                tbt_slo_s=tbt_slo_s,
            )
        return samples, seen

    # -- agents: joins, heartbeats, death ----------------------------------------------------
    def on_join(self, join: Join) -> tuple[bool, str]:
        if join.block_size != self.config.block_size:
            message = (
                f"its block size is {join.block_size} tokens, the Conductor's "
                f"{self.config.block_size}: start the agent with --block-size "
                f"{self.config.block_size} (or the Conductor with KVC_BLOCK_SIZE={join.block_size})"
            )
            return False, message
        with self._lock:
            known = self._agents.get(join.instance_id)
        if known is not None and known.join.incarnation != join.incarnation:
            # The same id from a new process: the old one died between two heartbeats. Its
            # blocks and its requests are gone with it.
            self.leave(join.instance_id, "restarted")
        channel = grpc.insecure_channel(join.control_address)
        info = AgentInfo(join, self._clock(), channel, pb_grpc.AgentStub(channel))
        capacity = join.kv_capacity_tokens if join.role == "decode" else None
        with self._lock:
            old = self._agents.pop(join.instance_id, None)
            self._agents[join.instance_id] = info
            self._left.pop(join.instance_id, None)
            now_s = self._clock()
            # Its first heartbeats announce every block it holds: the index of this
            # instance is rebuilt from them, not kept from before.
            effects = (
                *self.core.handle(ev.KvLost(now_s, join.instance_id)),
                *self.core.handle(ev.AgentJoined(now_s, join.instance_id, join.role, capacity)),
            )
            after = self._apply(effects)
        if old is not None:
            old.channel.close()
        self._after(after)
        if self._sessions is not None:
            with self._sessions() as session:
                cluster_log.record_agent_joined(
                    session=session,
                    instance_id=join.instance_id,
                    role=join.role,
                    rpc_address=join.control_address,
                    data_address=join.data_address,
                    now_s=info.last_seen_s,
                )
        logger.info("agent %s joined as %s", join.instance_id, join.role)
        return True, ""

    def on_heartbeat(self, heartbeat: Heartbeat) -> bool:
        """Apply a heartbeat; False when the instance is unknown (it must join again)."""
        with self._lock:
            info = self._agents.get(heartbeat.instance_id)
            if info is None:
                return False
            now_s = self._clock()
            info.last_seen_s, info.load = now_s, heartbeat.load
            if self.metrics is not None:
                self.metrics.set_instance_load(
                    heartbeat.instance_id, heartbeat.role, heartbeat.load
                )
            effects: list[Effect] = []
            if heartbeat.num_dropped_events:
                logger.warning(
                    "agent %s dropped %d KV events; forgetting its blocks in the index",
                    heartbeat.instance_id,
                    heartbeat.num_dropped_events,
                )
                effects.extend(self.core.handle(ev.KvLost(now_s, heartbeat.instance_id)))
            for event in heartbeat.events:
                effects.extend(self.core.handle(dataclasses.replace(event, now_s=now_s)))
            after = self._apply(effects)
            info.clock_offset_s = min(info.clock_offset_s, now_s - heartbeat.now_s)
            after.extend(self._measured(heartbeat, now_s, info.clock_offset_s))
        self._after(after)
        if heartbeat.is_final:
            self.leave(heartbeat.instance_id, "stopped")
        return True

    def _measured(
        self, heartbeat: Heartbeat, now_s: float, clock_offset_s: float
    ) -> list[Callable[[], None]]:
        """Take the agent's measurements into the calibration window; refit when due (lock
        held: the core believes the new model from the next event on). Returns the saving
        of the new state, to do after the lock."""
        calibrator = self.calibrator
        # Onto our clock: when each ended matters (host sharing reads how they overlapped).
        calibrator.add_prefill(
            dataclasses.replace(sample, time_s=min(now_s, sample.time_s + clock_offset_s))
            for sample in heartbeat.prefill_samples
        )
        calibrator.add_decode(
            dataclasses.replace(sample, time_s=min(now_s, sample.time_s + clock_offset_s))
            for sample in heartbeat.decode_steps
        )
        if not (self.calibrate and calibrator.is_due(now_s)):
            return []
        before = self.core.cost
        refit = calibrator.refit(now_s)
        if refit.cost == before:
            return []
        self.core.recost(refit.cost)
        logger.info(
            "calibration: refitted %s (prefill %s, decode %s, serving %s)%s",
            ", ".join(refit.updated) or "nothing",
            refit.cost.prefill, refit.cost.decode, refit.cost.serving,
            f"; {'; '.join(refit.notes)}" if refit.notes else "",
        )  # fmt: skip
        work: list[Callable[[], None]] = []
        if self.metrics is not None:
            work.append(lambda snapshot=calibrator.snapshot(): self._export_calibration(snapshot))
        if self._sessions is not None:
            state = calibrator.to_state()
            work.append(lambda: self._save_calibration(state, now_s))
        return work

    def _export_calibration(self, snapshot: Calibrator) -> None:
        residuals = snapshot.residuals()
        self.metrics.set_calibration(  # type: ignore[union-attr]
            snapshot.num_refits,
            residuals["prefill_median_rel_err"],
            residuals["decode_median_rel_err"],
        )

    def _save_calibration(self, state: dict, now_s: float) -> None:
        try:
            with self._sessions() as session:  # type: ignore[misc]
                calibration_store.save_calibration(session=session, state=state, now_s=now_s)
        except Exception:  # a failing database must not stop heartbeats
            logger.exception("calibration: could not save the refitted model")

    def _end_previous_requests(self) -> None:
        """Requests a previous Conductor left open on this database end `failed`: it died
        before they finished, and their agents dropped them with its connections."""
        assert self._sessions is not None
        with self._sessions() as session:
            num_ended = request_log.end_open_requests(
                session=session,
                now_s=self._clock(),
                reason="conductor_restart",
                message="the Conductor restarted before this request finished",
            )
        if num_ended:
            logger.warning(
                "%d request(s) left open by the previous Conductor ended as failed "
                "(conductor_restart)",
                num_ended,
            )

    def _restore_calibration(self) -> None:
        """Resume the calibration saved before a restart (its model and window)."""
        assert self._sessions is not None
        with self._sessions() as session:
            saved = calibration_store.load_calibration(session=session)
        if saved is None:
            return
        state, saved_s = saved
        try:
            self.calibrator.restore(state)
        except ValueError as error:
            logger.warning("calibration: the saved state is not usable (%s); starting over", error)
            return
        if self.calibrate:
            self.core.recost(self.calibrator.cost)
        logger.info(
            "calibration: resumed the model saved at %.0f (%d refits before): %s",
            saved_s, self.calibrator.num_refits, self.calibrator.cost.name,
        )  # fmt: skip

    def check_heartbeats(self) -> list[str]:
        """Declare agents silent for longer than the timeout dead; returns their ids."""
        now_s = self._clock()
        with self._lock:
            silent = [
                (agent_id, now_s - info.last_seen_s)
                for agent_id, info in self._agents.items()
                if now_s - info.last_seen_s > self.heartbeat_timeout_s
            ]
        for agent_id, silence_s in silent:
            self.leave(agent_id, f"missed heartbeats for {silence_s:.1f} s")
        return [agent_id for agent_id, _ in silent]

    def leave(self, instance_id: str, reason: str) -> None:
        """Take an agent out: the core re-routes what it had not started, fails the rest."""
        with self._lock:
            info = self._agents.pop(instance_id, None)
            if info is None:
                return
            self._left[instance_id] = reason
            self._prefill_lines.pop(instance_id, None)
            effects = self.core.handle(ev.AgentLeft(self._clock(), instance_id, reason))
            after = self._apply(effects)
        info.channel.close()
        if self.metrics is not None:
            self.metrics.remove_instance(instance_id)
        logger.warning("agent %s left: %s", instance_id, reason)
        self._after(after)
        if self._sessions is not None:
            state = "left" if reason == "stopped" else "dead"
            with self._sessions() as session:
                cluster_log.record_agent_left(
                    session=session, instance_id=instance_id, now_s=self._clock(), state=state
                )

    def switch_role(
        self, instance_id: str, role: str, *, drain_timeout_s: float = 30.0
    ) -> AgentInfo:
        """Drain an agent and serve with it in `role` (backend.runtime.roles explains how).

        LookupError: no such agent; RoleSwitchRefused: it is the last open instance of its
        role, or did not drain in time, or refused (it then keeps its old role).
        """
        with self._lock:
            info = self._agents.get(instance_id)
            if info is None:
                raise LookupError(f"no agent {instance_id!r} is joined")
            old_role = info.join.role
            if role == old_role:
                return info
            open_peers = [
                other
                for other_id, other in self._agents.items()
                if other_id != instance_id and other.join.role == old_role and not other.draining
            ]
            if not open_peers:
                raise RoleSwitchRefused(
                    f"{instance_id} is the last {old_role} instance; switching it would leave "
                    f"no {old_role} instance to serve"
                )
            info.draining = True
            self.core.handle(ev.AgentDraining(self._clock(), instance_id))
        try:
            wait_until_idle(lambda: self._num_core_requests(instance_id), timeout_s=drain_timeout_s)
            drained = info.stub.Drain(
                pb.DrainRequest(timeout_s=drain_timeout_s),
                metadata=self._metadata,
                timeout=drain_timeout_s + 10,
            )
            if not drained.drained:
                raise RoleSwitchRefused(
                    f"{instance_id} still has {drained.num_in_flight} call(s) in flight"
                )
            info.stub.SetRole(
                pb.SetRoleRequest(role=role_to_proto(role)),  # type: ignore[arg-type]
                metadata=self._metadata,
                timeout=10,
            )
        except (RoleSwitchRefused, grpc.RpcError) as error:
            self._rejoin(info, old_role)
            with contextlib.suppress(grpc.RpcError):  # SetRole ends the agent's drain too
                info.stub.SetRole(
                    pb.SetRoleRequest(role=role_to_proto(old_role)),
                    metadata=self._metadata,
                    timeout=10,
                )
            if isinstance(error, grpc.RpcError):
                raise RoleSwitchRefused(f"{instance_id} refused: {error.details()}") from None  # type: ignore[attr-defined]
            raise
        self._rejoin(info, role)
        if self._sessions is not None:
            with self._sessions() as session:
                cluster_log.record_agent_state(
                    session=session,
                    instance_id=instance_id,
                    state="active",
                    role=role,  # type: ignore[arg-type]
                )
        logger.info("agent %s switched from %s to %s", instance_id, old_role, role)
        return info

    def _rejoin(self, info: AgentInfo, role: str) -> None:
        """Put an instance (back) to work in the core under `role`."""
        with self._lock:
            info.join = dataclasses.replace(info.join, role=role)  # type: ignore[arg-type]
            info.draining = False
            capacity = info.join.kv_capacity_tokens if role == "decode" else None
            joined = ev.AgentJoined(self._clock(), info.join.instance_id, role, capacity)  # type: ignore[arg-type]
            after = self._apply(self.core.handle(joined))
        self._after(after)

    def _num_core_requests(self, instance_id: str) -> int:
        """Requests the core still has queued, running or headed to this instance."""
        with self._lock:
            prefill = self.core.prefill.get(instance_id)
            decode = self.core.decode.get(instance_id)
            count = len(prefill.request_ids()) if prefill is not None else 0
            if decode is not None:
                count += len(decode.incoming) + len(decode.decoding)
            return count

    def _watch(self) -> None:
        period_s = min(self.heartbeat_interval_s, self.heartbeat_timeout_s / 4)
        while not self._stopping.wait(period_s):
            self.check_heartbeats()
            self.cancel_overdue()

    # -- requests ----------------------------------------------------------------------------
    def submit(
        self,
        request_id: str,
        token_ids: Sequence[int],
        max_tokens: int,
        *,
        ttft_slo_s: float | None = None,
        tbt_slo_s: float | None = None,
        sampling: Sampling = Sampling(),
        on_token: Callable[[int], None] | None = None,
        keys: Sequence[int] | None = None,
        api_key_name: str | None = None,
    ) -> RequestStream:
        """Admit and run one request; tokens stream on the returned RequestStream. `keys`:
        the prompt's block keys when the caller has them already (else computed here);
        `api_key_name`: the name of the API key that sent it, for the request log."""
        if max_tokens < 1 or not token_ids:
            raise ValueError("a request needs prompt tokens and max_tokens >= 1")
        now_s = self._clock()
        keys = tuple(block_keys(token_ids, self.config.block_size) if keys is None else keys)
        # The SLOs in force now travel with the request and are recorded with it: it is
        # judged by them, whatever a later PUT /v1/config sets.
        arrival = ev.RequestArrived(
            now_s,
            request_id,
            keys,
            len(token_ids),
            max_tokens,
            self.config.ttft_slo_s if ttft_slo_s is None else ttft_slo_s,
            self.config.tbt_slo_s if tbt_slo_s is None else tbt_slo_s,
        )
        stream = RequestStream(
            request_id, tuple(token_ids), max_tokens, sampling, now_s, on_token=on_token
        )
        stream.block_keys = keys
        with self._lock:
            if request_id in self._requests:
                raise ValueError(f"request {request_id!r} was already submitted")
            if self._log is not None:
                try:
                    self._log.record_arrival(
                        arrival=arrival,
                        block_size=self.config.block_size,
                        api_key_name=api_key_name,
                    )
                except RecordNotAccepted as error:
                    raise RequestLogUnavailable(str(error)) from None
            self._requests[request_id] = stream
            self._open[request_id] = now_s
            after = self._apply(self.core.handle(arrival))
        self._after(after)
        return stream

    def request(self, request_id: str) -> RequestStream | None:
        with self._lock:
            return self._requests.get(request_id)

    # -- ending a request early --------------------------------------------------------------
    def cancel(self, request_id: str, reason: str) -> bool:
        """End an unfinished request `cancelled` with `reason` (its client went away, its
        deadline passed): the core forgets it, the agent call it waits on is cancelled and
        every agent that may hold it drops it (its batch slot, queued prefill or handed-off
        KV). Never waits on an agent: the API's event loop calls it. False when the request
        had ended already."""
        with self._lock:
            stream = self._requests.get(request_id)
            if stream is None or stream.is_finished:
                return False
            holders = self._holders(stream)
            now_s = self._clock()
            self.core.handle(ev.RequestCancelled(now_s, request_id, reason))
            outcome = dataclasses.replace(
                self._outcome("cancelled", reason, stream.stage), ttft_s=self._ttft_s(stream)
            )
            call, after = stream.call, self._end(request_id, outcome)
        self._drop_on_agents(request_id, reason, holders, call)
        self._after(after)
        logger.info("request %s cancelled (%s)", request_id, reason)
        return True

    def finish_early(self, request_id: str, reason: str = "stop_sequence") -> bool:
        """End a decoding request `completed` now, with the tokens it has (its text reached a
        stop sequence: the client has its whole answer), and have its agents drop the rest.
        False when it had ended already."""
        with self._lock:
            stream = self._requests.get(request_id)
            if stream is None or stream.is_finished:
                return False
            holders = self._holders(stream)
            now_s = self._clock()
            after = self._apply(
                self.core.handle(ev.DecodeFinished(now_s, request_id, len(stream.tokens)))
            )
            outcome = dataclasses.replace(
                self._outcome("completed", reason), ttft_s=self._ttft_s(stream)
            )
            call = stream.call
            after.extend(self._end(request_id, outcome))
        self._drop_on_agents(request_id, reason, holders, call)
        self._after(after)
        return True

    def cancel_overdue(self) -> list[str]:
        """Cancel every request unfinished `request_deadline_s` after its arrival."""
        deadline_s = self._clock() - self.request_deadline_s
        with self._lock:
            overdue = list(
                itertools.takewhile(lambda rid: self._open[rid] < deadline_s, self._open)
            )
        for request_id in overdue:
            self.cancel(request_id, "deadline")
        return overdue

    @staticmethod
    def _ttft_s(stream: RequestStream) -> float | None:
        times = stream.token_times_s
        return times[0] - stream.arrival_s if times else None

    def _holders(self, stream: RequestStream) -> list[AgentInfo]:
        """The agents that may hold some of the request now (lock held)."""
        ids = {stream.decode_instance_id}
        if stream.dispatch is not None:
            ids |= {stream.dispatch.instance_id, stream.dispatch.decode_instance_id}
        return [self._agents[i] for i in ids if i is not None and i in self._agents]

    def _drop_on_agents(
        self, request_id: str, reason: str, holders: list[AgentInfo], call: object | None
    ) -> None:
        if call is not None:
            call.cancel()  # type: ignore[attr-defined]
        for agent in holders:
            self._cancels.submit(self._cancel_on, agent, request_id, reason)

    def _cancel_on(self, agent: AgentInfo, request_id: str, reason: str) -> None:
        try:
            agent.stub.Cancel(
                pb.CancelRequest(request_id=request_id, reason=reason),
                metadata=self._metadata,
                timeout=5,
            )
        except grpc.RpcError as error:  # a dead agent drops its work anyway
            logger.warning(
                "cancel of %s on %s failed: %s", request_id, agent.join.instance_id, error
            )

    # -- effects -----------------------------------------------------------------------------
    def _apply(self, effects: Sequence[Effect]) -> list[Callable[[], None]]:
        """Carry out effects in memory (lock held); returns the blocking work to do after."""
        self._work_after = []
        carry_out(self, effects)
        after, self._work_after = self._work_after, []
        return after

    # -- the effects (EffectHandler; lock held, blocking work queued in _work_after) ---------
    def on_dispatch_prefill(self, effect: DispatchPrefill, *, replicate: bool) -> None:
        stream = self._requests[effect.request_id]
        stream.dispatch = effect
        stream.decisions.append(effect)
        num_reused_blocks = effect.plan.num_reused_tokens // self.config.block_size
        self.hits.record(stream.block_keys, num_reused_blocks)
        self._log_record("decision", decision=effect, now_s=self._clock())
        if self.metrics is not None:
            self._work_after.append(lambda e=effect: self.metrics.record_decision(e))
        self._pool.submit(self._run, effect, replicate)

    def on_replicate(self, effect: Replicate) -> None:
        # It rides on its DispatchPrefill (replicate=True): the agent keeps what it fetched.
        if self.metrics is not None:
            self._work_after.append(lambda e=effect: self.metrics.record_replication(e))

    def on_dispatch_decode(self, effect: DispatchDecode) -> None:
        """Carried out by the request's thread, which fed the PrefillFinished that made it."""

    def on_reject(self, effect: Reject) -> None:
        outcome = self._outcome("rejected", effect.reason, effect.stage, effect.message)
        self._requests[effect.request_id].retry_after_s = effect.retry_after_s
        self._work_after.extend(self._end(effect.request_id, outcome))

    def on_fail(self, effect: FailRequest) -> None:
        stage = self._requests[effect.request_id].stage
        outcome = self._outcome("failed", effect.reason, stage)
        self._work_after.extend(self._end(effect.request_id, outcome))

    def on_evict(self, effect: Evict) -> None:
        info = self._agents.get(effect.instance_id)
        if info is not None:
            self._work_after.append(lambda s=info.stub, e=effect: self._evict(s, e))

    def _after(self, work: list[Callable[[], None]]) -> None:
        for job in work:
            job()

    def _outcome(
        self, state: str, reason: str | None, stage: str | None = None, message: str | None = None
    ) -> RequestOutcome:
        return RequestOutcome(
            state,  # type: ignore[arg-type]
            self._clock(),
            reason=reason,
            stage=stage,
            message=message,
        )

    def _end(self, request_id: str, outcome: RequestOutcome) -> list[Callable[[], None]]:
        """Set the single terminal outcome (lock held); a second one is ignored."""
        stream = self._requests.get(request_id)
        if stream is None or stream.outcome is not None:
            return []
        tbt = stream.tbt_s()
        times = stream.token_times_s
        stream.outcome = dataclasses.replace(
            outcome,
            tbt_gap_histogram=gap_histogram(b - a for a, b in itertools.pairwise(times))
            if len(times) > 1
            else None,
            num_generated_tokens=len(stream.tokens),
            num_reused_tokens=stream.num_reused_tokens,
            num_transferred_tokens=stream.num_fetched_tokens,
            tbt_mean_s=tbt[0] if tbt else None,
            tbt_p99_s=tbt[1] if tbt else None,
            tbt_max_s=tbt[2] if tbt else None,
        )
        stream.dispatch = None
        self._open.pop(request_id, None)
        # Kept for the newest max_finished_requests finished requests: only what callers read
        # (outcome, generated tokens, decisions), not the prompt (160 KiB at 4,000 tokens).
        stream.token_ids, stream.block_keys, stream.token_times_s = (), (), []
        self._log_record("outcome", request_id=request_id, outcome=stream.outcome)
        self._finished.append(request_id)
        while len(self._finished) > self.max_finished_requests:
            self._requests.pop(self._finished.popleft(), None)
        return [stream.close]

    def _log_record(self, kind: str, **record: object) -> None:
        """Queue a decision or an outcome for the request log (lock held; never waits)."""
        if self._log is None:
            return
        try:
            getattr(self._log, f"record_{kind}")(**record)
        except RecordNotAccepted as error:  # the database has been failing for long
            logger.error("request log: a %s was not recorded: %s", kind, error)

    def _evict(self, stub: pb_grpc.AgentStub, effect: Evict) -> None:
        # Its KV events reach the core on the heartbeat channel (the agent flushes them before
        # answering); the copy in the answer is for drivers without heartbeats.
        try:
            stub.EvictBlocks(evict_to_proto(effect), metadata=self._metadata, timeout=10)
        except grpc.RpcError as error:
            logger.warning("evict on %s failed: %s", effect.instance_id, error)

    def _feed(self, event: ev.Event) -> tuple[Effect, ...]:
        with self._lock:
            effects = self.core.handle(event)
            after = self._apply(effects)
        self._after(after)
        return effects

    # -- one request's life on the agents (a pool thread) -------------------------------------
    def _run(self, effect: DispatchPrefill, replicate: bool) -> None:
        stream = self._requests[effect.request_id]
        try:
            self._run_prefill(stream, effect, replicate)
        except Exception as error:  # never lose a request to a bug in this thread
            logger.exception("request %s failed", effect.request_id)
            self._fail(stream, f"runtime error: {error}", "prefill")

    def _run_prefill(self, stream: RequestStream, effect: DispatchPrefill, replicate: bool) -> None:
        with self._lock:
            if stream.dispatch is not effect:
                return  # re-routed or ended meanwhile
            prefill = self._agents.get(effect.instance_id)
            if prefill is None:
                return  # its AgentLeft re-routes or fails it
            addresses = {i: a.join.data_address for i, a in self._agents.items()}
            prefill_id = effect.instance_id
            after = self._apply(self._join_line(prefill_id, stream.request_id))
        self._after(after)
        request = dispatch_prefill_to_proto(
            effect, stream.token_ids, addresses, replicate=replicate
        )
        request.sampling.CopyFrom(_sampling_to_proto(stream.sampling))
        call = prefill.stub.DispatchPrefill.future(request, metadata=self._metadata)
        self._waiting_on(stream, call)
        try:
            reply = call.result()
        except (grpc.RpcError, grpc.FutureCancelledError) as error:
            with self._lock:
                after = self._apply(self._leave_line(prefill_id, stream.request_id))
            self._after(after)
            if isinstance(error, grpc.RpcError):
                self._on_rpc_error(stream, prefill_id, error, "prefill", effect)
            return  # cancelled: the request has its outcome already
        stream.prefill_answered_s = self._clock()
        stream.prefill_agent_s = reply.timings.total_s
        stream.num_reused_tokens = reply.num_reused_tokens
        stream.num_fetched_tokens = reply.num_fetched_tokens
        if reply.HasField("first_logprob"):
            stream.first_logprob = _logprob(reply.first_logprob, reply.first_top_logprobs)
        with self._lock:
            if stream.dispatch is not effect:
                after = self._apply(self._leave_line(prefill_id, stream.request_id))
                effects = ()
            else:
                self._measured_fetch(effect, reply)
                effects = self.core.handle(
                    ev.PrefillFinished(self._clock(), stream.request_id, prefill_id)
                )
                stream.stage = "decode"
                after = self._apply((*effects, *self._leave_line(prefill_id, stream.request_id)))
        self._after(after)
        for decode in effects:
            if isinstance(decode, DispatchDecode) and decode.request_id == stream.request_id:
                self._run_decode(stream, decode, reply.first_token)

    def _measured_fetch(self, effect: DispatchPrefill, reply: pb.DispatchPrefillReply) -> None:
        """Tell the core how fast the fetch the plan asked for went (under the lock): its
        per-link bandwidth estimates steer later transfers (backend.policy.links)."""
        fetch = effect.plan.fetch
        if fetch is None or reply.num_fetched_tokens <= 0:
            return
        num_bytes = reply.num_fetched_tokens * self.core.cost.kv_bytes_per_token
        self.core.handle(
            ev.TransferMeasured(
                self._clock(),
                fetch.source_instance_id,
                effect.instance_id,
                num_bytes,
                reply.timings.fetch_s,
            )
        )

    def _waiting_on(self, stream: RequestStream, call: object) -> None:
        """Let a cancel reach the agent call `stream` now waits on (cancelled at once if the
        request ended while the call was being made)."""
        with self._lock:
            stream.call = call  # type: ignore[assignment]
            finished = stream.is_finished
        if finished:
            call.cancel()  # type: ignore[attr-defined]

    def _join_line(self, instance_id: str, request_id: str) -> tuple[Effect, ...]:
        """Queue a dispatched request at its prefill agent; it starts at once if first.
        Under the lock."""
        line = self._prefill_lines.setdefault(instance_id, deque())
        line.append(request_id)
        if len(line) > 1:
            return ()
        return self.core.handle(ev.PrefillStarted(self._clock(), request_id, instance_id))

    def _leave_line(self, instance_id: str, request_id: str) -> tuple[Effect, ...]:
        """The request's prefill ended (answered or failed): the next live one in its agent's
        line starts. Under the lock."""
        line = self._prefill_lines.get(instance_id)
        if not line or request_id not in line:
            return ()
        was_first = line[0] == request_id
        line.remove(request_id)
        while was_first and line:
            head = self._requests.get(line[0])
            dispatch = head.dispatch if head is not None else None
            if head is None or head.is_finished or dispatch is None:
                line.popleft()  # ended meanwhile
                continue
            if dispatch.instance_id != instance_id:
                line.popleft()  # re-routed meanwhile
                continue
            return self.core.handle(ev.PrefillStarted(self._clock(), line[0], instance_id))
        return ()

    def _run_decode(self, stream: RequestStream, effect: DispatchDecode, first_token: int) -> None:
        with self._lock:
            agent = self._agents.get(effect.instance_id)
        if agent is None:
            self._fail(stream, f"decode instance {effect.instance_id} is gone", "decode")
            return
        request = dispatch_decode_to_proto(
            effect, first_token=first_token, max_tokens=stream.max_tokens
        )
        request.sampling.CopyFrom(_sampling_to_proto(stream.sampling))
        stream.decode_instance_id = effect.instance_id
        started = False
        call = agent.stub.DispatchDecode(request, metadata=self._metadata)
        self._waiting_on(stream, call)
        try:
            for message in call:
                if stream.is_finished:
                    return  # failed meanwhile (its decode agent left)
                if message.done:
                    self._on_decode_done(stream, effect, message)
                    return
                if not started:
                    started = True
                    self._feed(
                        ev.DecodeStarted(self._clock(), stream.request_id, effect.instance_id)
                    )
                stream.push_token(message.token, self._clock(), _message_logprob(stream, message))
                self._feed(ev.DecodeStep(self._clock(), stream.request_id, len(stream.tokens)))
        except grpc.RpcError as error:
            self._on_rpc_error(stream, effect.instance_id, error, "decode")
            return
        self._fail(stream, "decode stream ended without a terminal message", "decode")

    def _on_decode_done(
        self, stream: RequestStream, effect: DispatchDecode, message: pb.DecodeMessage
    ) -> None:
        now_s = self._clock()
        serving = None
        if message.status == "cancelled":  # the agent dropped it (a cancel from elsewhere)
            self.cancel(stream.request_id, message.reason or "cancelled_by_agent")
            return
        if message.status == "rejected":
            reason = message.reason or "decode_rejected"
            event: ev.Event = ev.DecodeRejected(
                now_s, stream.request_id, effect.instance_id, reason
            )
            outcome = self._outcome("rejected", reason, message.stage or "decode")
        else:
            event = ev.DecodeFinished(now_s, stream.request_id, len(stream.tokens))
            # TTFT (backend/observe/measures.py): arrival to the first token leaving the Conductor.
            first_s = stream.token_times_s[0] if stream.token_times_s else now_s
            ttft_s = first_s - stream.arrival_s
            outcome = dataclasses.replace(self._outcome("completed", None), ttft_s=ttft_s)
            serving = self._serving_sample(stream, first_s, now_s)
        with self._lock:
            after = self._apply(self.core.handle(event))
            after.extend(self._end(stream.request_id, outcome))
            if serving is not None:
                self.calibrator.add_serving((serving,))
        self._after(after)

    @staticmethod
    def _serving_sample(
        stream: RequestStream, first_s: float, now_s: float
    ) -> ServingSample | None:
        """What the serving path cost this completed request, beyond the agents' own work."""
        if stream.prefill_answered_s is None:
            return None
        tbt = stream.tbt_s()
        return ServingSample(
            time_s=now_s,
            dispatch_s=max(
                0.0, stream.prefill_answered_s - stream.arrival_s - stream.prefill_agent_s
            ),
            first_token_s=max(0.0, first_s - stream.prefill_answered_s),
            tbt_mean_s=tbt[0] if tbt else None,
            num_gaps=max(0, len(stream.token_times_s) - 1),
        )

    def _on_rpc_error(
        self,
        stream: RequestStream,
        instance_id: str,
        error: grpc.RpcError,
        stage: str,
        effect: DispatchPrefill | None = None,
    ) -> None:
        """An unreachable agent is dead (AgentLeft fails its in-flight requests, this one
        included); a prefill whose KV hand-off failed (ABORTED: that prefill agent is fine)
        is placed again once, after its decode agent is taken out if it no longer answers;
        any other error fails just this request."""
        code = error.code()  # type: ignore[attr-defined]
        details = error.details() or ""  # type: ignore[attr-defined]
        if code == grpc.StatusCode.UNAVAILABLE:
            self.leave(instance_id, f"unreachable ({details})")
        handoff = code == grpc.StatusCode.ABORTED and "hand-off" in details
        if handoff and effect is not None and self._retry_after_handoff(stream, effect, details):
            return
        self._fail(stream, f"{stage} on {instance_id} failed: {code.name} {details}"[:500], stage)

    def _retry_after_handoff(
        self, stream: RequestStream, effect: DispatchPrefill, details: str
    ) -> bool:
        """The KV of `stream`'s prefill could not reach its decode agent: take that agent out
        if it does not answer (it died and nobody noticed yet), then place the request again
        (its prefix is cached now, so the second prefill costs little). False when it was
        placed again once already."""
        if stream.num_retries >= 1:
            return False
        decode_id = effect.decode_instance_id
        with self._lock:
            decode = self._agents.get(decode_id)
        if decode is not None and not self._answers(decode):
            self.leave(decode_id, f"unreachable (a KV hand-off to it failed: {details})"[:500])
        with self._lock:
            if stream.is_finished:
                return True  # ended meanwhile (e.g. cancelled): nothing to retry
            stream.num_retries += 1
            stream.stage, stream.dispatch = "prefill", None
            now_s = self._clock()
            effects = self.core.handle(ev.RequestRetried(now_s, stream.request_id, details[:200]))
            if not effects:  # the core had forgotten it: fail it rather than leave it open
                return False
            after = self._apply(effects)
        logger.warning("request %s placed again: %s", stream.request_id, details)
        self._after(after)
        return True

    def _answers(self, agent: AgentInfo) -> bool:
        try:
            agent.stub.GetState(pb.GetStateRequest(), metadata=self._metadata, timeout=1.0)
        except grpc.RpcError:
            return False
        return True

    def _fail(self, stream: RequestStream, reason: str, stage: str) -> None:
        """End a request as failed and drop it from the core's books."""
        with self._lock:
            if stream.outcome is not None:
                return
            self.core.handle(ev.RequestFailed(self._clock(), stream.request_id, reason))
            after = self._end(stream.request_id, self._outcome("failed", reason, stage))
        self._after(after)


def _logprob(value: float, alternatives: Sequence[pb.TokenLogprob]) -> Logprob:
    return Logprob(value, tuple((a.token, a.logprob) for a in alternatives))


def _message_logprob(stream: RequestStream, message: pb.DecodeMessage) -> Logprob | None:
    """A streamed token's log-probability: the first token's came with the prefill's answer."""
    if message.index == 0:
        return stream.first_logprob
    if message.HasField("logprob"):
        return _logprob(message.logprob, message.top_logprobs)
    return None


def _sampling_to_proto(sampling: Sampling) -> pb.Sampling:
    seed = (sampling.seed + 2**63) % 2**64 - 2**63  # into int64, as agent.proto carries it
    return pb.Sampling(
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        seed=seed,
        ignore_eos=sampling.ignore_eos,
        logprobs=sampling.logprobs,
        top_logprobs=sampling.top_logprobs,
    )
