"""AgentRegistry: which agents serve, as what, and what they last reported.

Joins (a new process under a known id is a restart: the old one left first, its blocks
with it), heartbeats (load, KV events on their one channel, calibration measurements),
death by silence, and role switches (drain, switch, rejoin). Every change goes through the
policy core, so routing sees the same cluster the registry does; cluster history goes to
the database.
"""

import contextlib
import dataclasses
import logging
from collections.abc import Callable

import grpc
from sqlalchemy.orm import Session, sessionmaker

from backend.db import cluster_log
from backend.db.records import LoadSample
from backend.policy import events as ev
from backend.policy.effects import Effect
from backend.rpc import agent_pb2 as pb
from backend.rpc import agent_pb2_grpc as pb_grpc
from backend.rpc.convert import role_to_proto
from backend.rpc.reports import Heartbeat, Join
from backend.runtime.calibration import CalibrationFeed
from backend.runtime.executor import EffectExecutor
from backend.runtime.roles import RoleSwitchRefused, wait_until_idle
from backend.runtime.state import AgentInfo, RuntimeState, run_after

logger = logging.getLogger(__name__)


class AgentRegistry:
    """Joined agents and the ones that left; see the module doc."""

    def __init__(
        self,
        state: RuntimeState,
        executor: EffectExecutor,
        calibration: CalibrationFeed,
        *,
        metadata: tuple[tuple[str, str], ...],
        heartbeat_timeout_s: float,
        session_factory: sessionmaker[Session] | None,
    ) -> None:
        self._state = state
        self._executor = executor
        self._calibration = calibration
        self._metadata = metadata
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._sessions = session_factory
        self._left: dict[str, str] = {}  # instance id -> why it left
        # Set by the runtime: forget what the runner keeps for an agent that left.
        self.on_left: Callable[[str], None] = lambda instance_id: None

    # -- reading ---------------------------------------------------------------------------------
    def left(self) -> dict[str, str]:
        """Instances that left, and why."""
        with self._state.lock:
            return dict(self._left)

    def missing_roles(self) -> list[str]:
        """The roles ("prefill", "decode") with no instance taking requests now: a request
        would be refused until one joins (or ends its drain). Empty when it can serve."""
        core = self._state.core
        with self._state.lock:
            serving = {
                "prefill": any(not s.draining for s in core.prefill.values()),
                "decode": any(not s.draining for s in core.decode.values()),
            }
        return [role for role, present in serving.items() if not present]

    def sample_loads(self) -> tuple[list[LoadSample], dict[str, float]]:
        """Every joined instance's load now (see LoadSampler), and when each was last seen."""
        state = self._state
        with state.lock:
            now_s = state.clock()
            core = state.core
            decode_loads = core.decode_loads()
            samples = []
            for instance_id, info in state.agents.items():
                prefill = core.prefill.get(instance_id)
                load = info.load
                samples.append(
                    LoadSample(
                        time_s=now_s,
                        instance_id=instance_id,
                        prefill_load_s=(
                            core.queue_s(prefill, now_s) if prefill is not None else None
                        ),
                        decode_load=decode_loads.get(instance_id),
                        memory_used_bytes=load.dram_bytes + load.ssd_bytes,
                        memory_capacity_bytes=load.dram_capacity_bytes + load.ssd_capacity_bytes,
                    )
                )
            seen = {instance_id: info.last_seen_s for instance_id, info in state.agents.items()}
            roles = {instance_id: info.join.role for instance_id, info in state.agents.items()}
            ttft_slo_s, tbt_slo_s = state.config.ttft_slo_s, state.config.tbt_slo_s
            links = core.links.snapshot()
        metrics = state.metrics
        if metrics is not None:
            metrics.set_links(links)
            loads = {
                (s.instance_id, roles[s.instance_id]): (
                    s.prefill_load_s / ttft_slo_s if s.prefill_load_s is not None else s.decode_load
                )
                for s in samples
            }
            metrics.set_pool_sample(
                {key: load for key, load in loads.items() if load is not None},
                {(i, roles[i]): max(0.0, now_s - seen_s) for i, seen_s in seen.items()},
                ttft_slo_s=ttft_slo_s,
                tbt_slo_s=tbt_slo_s,
            )
        return samples, seen

    # -- joins, heartbeats, death ----------------------------------------------------------------
    def on_join(self, join: Join) -> tuple[bool, str]:
        state = self._state
        block_size = state.config.block_size
        if join.block_size != block_size:
            message = (
                f"its block size is {join.block_size} tokens, the Conductor's "
                f"{block_size}: start the agent with --block-size "
                f"{block_size} (or the Conductor with KVC_BLOCK_SIZE={join.block_size})"
            )
            return False, message
        with state.lock:
            known = state.agents.get(join.instance_id)
        if known is not None and known.join.incarnation != join.incarnation:
            # The same id from a new process: the old one died between two heartbeats. Its
            # blocks and its requests are gone with it.
            self.leave(join.instance_id, "restarted")
        channel = grpc.insecure_channel(join.control_address)
        info = AgentInfo(join, state.clock(), channel, pb_grpc.AgentStub(channel))
        capacity = join.kv_capacity_tokens if join.role == "decode" else None
        with state.lock:
            old = state.agents.pop(join.instance_id, None)
            state.agents[join.instance_id] = info
            self._left.pop(join.instance_id, None)
            now_s = state.clock()
            # Its first heartbeats announce every block it holds: the index of this
            # instance is rebuilt from them, not kept from before.
            effects = (
                *state.core.handle(ev.KvLost(now_s, join.instance_id)),
                *state.core.handle(ev.AgentJoined(now_s, join.instance_id, join.role, capacity)),
            )
            after = self._executor.apply(effects)
        if old is not None:
            old.channel.close()
        run_after(after)
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
        state = self._state
        with state.lock:
            info = state.agents.get(heartbeat.instance_id)
            if info is None:
                return False
            now_s = state.clock()
            info.last_seen_s, info.load = now_s, heartbeat.load
            if state.metrics is not None:
                state.metrics.set_instance_load(
                    heartbeat.instance_id, heartbeat.role, heartbeat.load
                )
            effects: list[Effect] = []
            if heartbeat.num_dropped_events:
                logger.warning(
                    "agent %s dropped %d KV events; forgetting its blocks in the index",
                    heartbeat.instance_id,
                    heartbeat.num_dropped_events,
                )
                effects.extend(state.core.handle(ev.KvLost(now_s, heartbeat.instance_id)))
            for event in heartbeat.events:
                effects.extend(state.core.handle(dataclasses.replace(event, now_s=now_s)))
            after = self._executor.apply(effects)
            info.clock_offset_s = min(info.clock_offset_s, now_s - heartbeat.now_s)
            after.extend(self._calibration.on_heartbeat(heartbeat, now_s, info.clock_offset_s))
        run_after(after)
        if heartbeat.is_final:
            self.leave(heartbeat.instance_id, "stopped")
        return True

    def check_heartbeats(self) -> list[str]:
        """Declare agents silent for longer than the timeout dead; returns their ids."""
        state = self._state
        now_s = state.clock()
        with state.lock:
            silent = [
                (agent_id, now_s - info.last_seen_s)
                for agent_id, info in state.agents.items()
                if now_s - info.last_seen_s > self.heartbeat_timeout_s
            ]
        for agent_id, silence_s in silent:
            self.leave(agent_id, f"missed heartbeats for {silence_s:.1f} s")
        return [agent_id for agent_id, _ in silent]

    def leave(self, instance_id: str, reason: str) -> None:
        """Take an agent out: the core re-routes what it had not started, fails the rest."""
        state = self._state
        with state.lock:
            info = state.agents.pop(instance_id, None)
            if info is None:
                return
            self._left[instance_id] = reason
            effects = state.core.handle(ev.AgentLeft(state.clock(), instance_id, reason))
            after = self._executor.apply(effects)
        info.channel.close()
        self.on_left(instance_id)
        if state.metrics is not None:
            state.metrics.remove_instance(instance_id)
        logger.warning("agent %s left: %s", instance_id, reason)
        run_after(after)
        if self._sessions is not None:
            agent_state = "left" if reason == "stopped" else "dead"
            with self._sessions() as session:
                cluster_log.record_agent_left(
                    session=session, instance_id=instance_id, now_s=state.clock(), state=agent_state
                )

    # -- role switches ---------------------------------------------------------------------------
    def switch_role(
        self, instance_id: str, role: str, *, drain_timeout_s: float = 30.0
    ) -> AgentInfo:
        """Drain an agent and serve with it in `role` (backend.runtime.roles explains how).

        LookupError: no such agent; RoleSwitchRefused: it is the last open instance of its
        role, or did not drain in time, or refused (it then keeps its old role).
        """
        state = self._state
        with state.lock:
            info = state.agents.get(instance_id)
            if info is None:
                raise LookupError(f"no agent {instance_id!r} is joined")
            old_role = info.join.role
            if role == old_role:
                return info
            open_peers = [
                other
                for other_id, other in state.agents.items()
                if other_id != instance_id and other.join.role == old_role and not other.draining
            ]
            if not open_peers:
                raise RoleSwitchRefused(
                    f"{instance_id} is the last {old_role} instance; switching it would leave "
                    f"no {old_role} instance to serve"
                )
            info.draining = True
            state.core.handle(ev.AgentDraining(state.clock(), instance_id))
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
        state = self._state
        with state.lock:
            info.join = dataclasses.replace(info.join, role=role)  # type: ignore[arg-type]
            info.draining = False
            capacity = info.join.kv_capacity_tokens if role == "decode" else None
            joined = ev.AgentJoined(state.clock(), info.join.instance_id, role, capacity)  # type: ignore[arg-type]
            after = self._executor.apply(state.core.handle(joined))
        run_after(after)

    def _num_core_requests(self, instance_id: str) -> int:
        """Requests the core still has queued, running or headed to this instance."""
        core = self._state.core
        with self._state.lock:
            prefill = core.prefill.get(instance_id)
            decode = core.decode.get(instance_id)
            count = len(prefill.request_ids()) if prefill is not None else 0
            if decode is not None:
                count += len(decode.incoming) + len(decode.decoding)
            return count
