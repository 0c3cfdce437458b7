"""ConductorRuntime: the live driver of the policy core, assembled from parts with one job
each.

- `RuntimeState` (state.py): the core, the agents, the requests, and the one lock;
- `AgentRegistry` (registry.py): joins, heartbeats, death, restarts, role switches;
- `CalibrationFeed` (calibration.py): the agents' measurements into the online calibration;
- `EffectExecutor` (executor.py): the core's effects in memory, one outcome per request,
  the request log;
- `RequestRunner` (runner.py): each request's calls to its agents, as tasks on one event
  loop.

This module wires them, serves the Conductor gRPC service, watches deadlines and
heartbeats, and is what the API calls: `submit`, `cancel`, `finish_early`. Time comes from
an injected clock.
"""

import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures

import grpc
from sqlalchemy.orm import Session, sessionmaker

from backend.db import request_log
from backend.db.records import LoadSample
from backend.db.writer import RequestLogWriter
from backend.metrics import ConductorMetrics
from backend.policy import ConductorCore, CostModel, PolicyConfig, block_keys
from backend.policy import events as ev
from backend.policy.calibration import Calibrator
from backend.rpc import agent_pb2_grpc as pb_grpc
from backend.rpc.auth import SecretInterceptor, call_metadata
from backend.rpc.reports import Heartbeat, Join
from backend.runtime.calibration import CalibrationFeed
from backend.runtime.executor import EffectExecutor, RequestLogUnavailable
from backend.runtime.hotspots import BlockHits
from backend.runtime.registry import AgentRegistry
from backend.runtime.requests import RequestStream, Sampling
from backend.runtime.runner import RequestRunner
from backend.runtime.sampler import LoadSampler
from backend.runtime.service import ConductorService
from backend.runtime.state import AgentInfo, RuntimeState, run_after
from backend.settings.conductor import ConductorSettings

__all__ = ["AgentInfo", "ConductorRuntime", "RequestLogUnavailable"]

logger = logging.getLogger(__name__)


class ConductorRuntime:
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
        config = settings.policy_config()
        self._state = state = RuntimeState(ConductorCore(config, cost), config, clock)
        self.heartbeat_interval_s = settings.heartbeat_interval_s
        self._secret = settings.agent_secret.get_secret_value()
        metadata = call_metadata(self._secret)
        self._sessions = session_factory
        self._address = grpc_address or f"{settings.grpc_host}:{settings.grpc_port}"
        log = (
            RequestLogWriter(session_factory, put_timeout_s=0).start()
            if session_factory is not None
            else None
        )
        self._executor = EffectExecutor(state, log, max_finished_requests=max_finished_requests)
        # The cost model refitted from what the agents measure (heartbeats) and what the
        # runner measures of the serving path; `calibrate` off: measured, never applied.
        self._calibration = CalibrationFeed(
            state,
            Calibrator(cost, settings.calibration_config()),
            calibrate=settings.calibrate,
            session_factory=session_factory,
        )
        self._registry = AgentRegistry(
            state,
            self._executor,
            self._calibration,
            metadata=metadata,
            heartbeat_timeout_s=settings.heartbeat_timeout_s,
            session_factory=session_factory,
        )
        self._runner = RequestRunner(
            state,
            self._executor,
            self._calibration.calibrator,
            metadata=metadata,
            request_deadline_s=settings.request_deadline_s,
            leave=self._registry.leave,
            cancel=self.cancel,
        )
        self._executor.launch = self._runner.launch
        self._executor.send_evict = self._runner.send_evict
        self._registry.on_left = self._runner.forget
        self._sampler = (
            LoadSampler(
                self._registry.sample_loads,
                session_factory,
                interval_s=settings.load_sample_interval_s,
            )
            if session_factory is not None
            else None
        )
        self._server: grpc.Server | None = None
        self._stopping = threading.Event()
        self._monitor: threading.Thread | None = None
        self.port = 0
        if session_factory is not None:
            self._end_previous_requests()
            self._calibration.restore()

    # -- what the parts hold, for readers ----------------------------------------------------------
    @property
    def core(self) -> ConductorCore:
        return self._state.core

    @property
    def config(self) -> PolicyConfig:
        return self._state.config

    @property
    def metrics(self) -> ConductorMetrics | None:
        return self._state.metrics

    @property
    def calibrator(self) -> Calibrator:
        return self._calibration.calibrator

    @property
    def calibrate(self) -> bool:
        return self._calibration.calibrate

    @property
    def hits(self) -> BlockHits:
        return self._executor.hits

    @property
    def heartbeat_timeout_s(self) -> float:
        return self._registry.heartbeat_timeout_s

    @property
    def request_deadline_s(self) -> float:
        """A request unfinished this long after its arrival is cancelled ("deadline")."""
        return self._runner.request_deadline_s

    @request_deadline_s.setter
    def request_deadline_s(self, seconds: float) -> None:
        self._runner.request_deadline_s = seconds

    @property
    def num_running_tasks(self) -> int:
        """Requests with a task on the runner's loop now (none hold a thread)."""
        return self._runner.num_tasks

    # -- life ------------------------------------------------------------------------------------
    @property
    def address(self) -> str:
        host = self._address.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    def start(self, *, watch: bool = True) -> "ConductorRuntime":
        """Serve the Conductor service; `watch`: check heartbeats and deadlines periodically
        (else call `check_heartbeats()` and `cancel_overdue()` yourself)."""
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
        self._runner.stop()
        for agent in self.agents().values():
            agent.channel.close()
        log = self._executor.log
        if log is not None and not log.stop():
            logger.error("the request log lost records at stop: %s", log.stats)

    def flush_records(self, timeout_s: float | None = 10.0) -> bool:
        """Wait until every arrival, decision and outcome so far is in the database (readers
        that must see them call this first); False when `timeout_s` passed first."""
        log = self._executor.log
        return log.flush(timeout_s) if log is not None else True

    def attach_metrics(self, metrics: ConductorMetrics) -> None:
        """Record decisions and replications in `metrics` (the app's /metrics registry)."""
        self._state.metrics = metrics

    def reconfigure(self, config: PolicyConfig) -> None:
        """Apply a new policy configuration to the running core (between two events)."""
        if config.block_size != self.config.block_size:
            raise ValueError("block_size cannot change while agents are joined with it")
        with self._state.lock:
            self._state.core.reconfigure(config)
            self._state.config = config

    def now_s(self) -> float:
        """The runtime's clock, the one heartbeats and events are stamped with."""
        return self._state.clock()

    def locked(self) -> threading.Lock:
        """The lock that owns the core: hold it (`with runtime.locked():`) to read the core's
        index or queues consistently from another thread."""
        return self._state.lock

    def _end_previous_requests(self) -> None:
        """Requests a previous Conductor left open on this database end `failed`: it died
        before they finished, and their agents dropped them with its connections."""
        assert self._sessions is not None
        with self._sessions() as session:
            num_ended = request_log.end_open_requests(
                session=session,
                now_s=self.now_s(),
                reason="conductor_restart",
                message="the Conductor restarted before this request finished",
            )
        if num_ended:
            logger.warning(
                "%d request(s) left open by the previous Conductor ended as failed "
                "(conductor_restart)",
                num_ended,
            )

    def _watch(self) -> None:
        period_s = min(self.heartbeat_interval_s, self.heartbeat_timeout_s / 4)
        while not self._stopping.wait(period_s):
            self.check_heartbeats()
            self.cancel_overdue()

    # -- agents (AgentRegistry) ------------------------------------------------------------------
    def agents(self) -> dict[str, AgentInfo]:
        with self._state.lock:
            return dict(self._state.agents)

    def agents_locked(self) -> list[AgentInfo]:
        """The joined agents, for a caller holding `locked()`."""
        return list(self._state.agents.values())

    def on_join(self, join: Join) -> tuple[bool, str]:
        return self._registry.on_join(join)

    def on_heartbeat(self, heartbeat: Heartbeat) -> bool:
        """Apply a heartbeat; False when the instance is unknown (it must join again)."""
        return self._registry.on_heartbeat(heartbeat)

    def check_heartbeats(self) -> list[str]:
        """Declare agents silent for longer than the timeout dead; returns their ids."""
        return self._registry.check_heartbeats()

    def leave(self, instance_id: str, reason: str) -> None:
        """Take an agent out: the core re-routes what it had not started, fails the rest."""
        self._registry.leave(instance_id, reason)

    def switch_role(
        self, instance_id: str, role: str, *, drain_timeout_s: float = 30.0
    ) -> AgentInfo:
        """Drain an agent and serve with it in `role` (see AgentRegistry.switch_role)."""
        return self._registry.switch_role(instance_id, role, drain_timeout_s=drain_timeout_s)

    def missing_roles(self) -> list[str]:
        """The roles with no instance taking requests now (empty when it can serve)."""
        return self._registry.missing_roles()

    def left(self) -> dict[str, str]:
        """Instances that left, and why."""
        return self._registry.left()

    def sample_loads(self) -> tuple[list[LoadSample], dict[str, float]]:
        """Every joined instance's load now, and when each was last seen."""
        return self._registry.sample_loads()

    # -- requests --------------------------------------------------------------------------------
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
        `api_key_name`: the name of the API key that sent it, for the request log. Never
        waits on an agent: the API's event loop calls it."""
        if max_tokens < 1 or not token_ids:
            raise ValueError("a request needs prompt tokens and max_tokens >= 1")
        config = self.config
        now_s = self.now_s()
        keys = tuple(block_keys(token_ids, config.block_size) if keys is None else keys)
        # The SLOs in force now travel with the request and are recorded with it: it is
        # judged by them, whatever a later PUT /v1/config sets.
        arrival = ev.RequestArrived(
            now_s,
            request_id,
            keys,
            len(token_ids),
            max_tokens,
            config.ttft_slo_s if ttft_slo_s is None else ttft_slo_s,
            config.tbt_slo_s if tbt_slo_s is None else tbt_slo_s,
        )
        stream = RequestStream(
            request_id, tuple(token_ids), max_tokens, sampling, now_s, on_token=on_token
        )
        stream.block_keys = keys
        self._executor.admit(
            stream, arrival, block_size=config.block_size, api_key_name=api_key_name
        )
        return stream

    def request(self, request_id: str) -> RequestStream | None:
        with self._state.lock:
            return self._state.requests.get(request_id)

    # -- ending a request early ------------------------------------------------------------------
    def cancel(self, request_id: str, reason: str) -> bool:
        """End an unfinished request `cancelled` with `reason` (its client went away, its
        deadline passed): the core forgets it, its runner task stops and every agent that
        may hold it drops it (its batch slot, queued prefill or handed-off KV). Never waits on
        an agent. False when the request had ended already."""
        state, executor = self._state, self._executor
        with state.lock:
            stream = state.requests.get(request_id)
            if stream is None or stream.is_finished:
                return False
            holders = self._holders(stream)
            state.core.handle(ev.RequestCancelled(state.clock(), request_id, reason))
            outcome = dataclasses.replace(
                executor.outcome("cancelled", reason, stream.stage), ttft_s=_ttft_s(stream)
            )
            call, after = stream.call, executor.end(request_id, outcome)
        self._runner.drop_on_agents(request_id, reason, holders, call)
        run_after(after)
        logger.info("request %s cancelled (%s)", request_id, reason)
        return True

    def finish_early(self, request_id: str, reason: str = "stop_sequence") -> bool:
        """End a decoding request `completed` now, with the tokens it has (its text reached a
        stop sequence: the client has its whole answer), and have its agents drop the rest.
        False when it had ended already."""
        state, executor = self._state, self._executor
        with state.lock:
            stream = state.requests.get(request_id)
            if stream is None or stream.is_finished:
                return False
            holders = self._holders(stream)
            finished = ev.DecodeFinished(state.clock(), request_id, len(stream.tokens))
            after = executor.apply(state.core.handle(finished))
            outcome = dataclasses.replace(
                executor.outcome("completed", reason), ttft_s=_ttft_s(stream)
            )
            call = stream.call
            after.extend(executor.end(request_id, outcome))
        self._runner.drop_on_agents(request_id, reason, holders, call)
        run_after(after)
        return True

    def cancel_overdue(self) -> list[str]:
        """Cancel every request unfinished `request_deadline_s` after its arrival."""
        deadline_s = self.now_s() - self.request_deadline_s
        open_requests = self._executor.open
        with self._state.lock:
            overdue = list(
                itertools.takewhile(lambda rid: open_requests[rid] < deadline_s, open_requests)
            )
        for request_id in overdue:
            self.cancel(request_id, "deadline")
        return overdue

    def _holders(self, stream: RequestStream) -> list[AgentInfo]:
        """The agents that may hold some of the request now (lock held)."""
        ids = {stream.decode_instance_id}
        if stream.dispatch is not None:
            ids |= {stream.dispatch.instance_id, stream.dispatch.decode_instance_id}
        agents = self._state.agents
        return [agents[i] for i in ids if i is not None and i in agents]


def _ttft_s(stream: RequestStream) -> float | None:
    times = stream.token_times_s
    return times[0] - stream.arrival_s if times else None
