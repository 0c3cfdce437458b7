"""Heartbeats: join the Conductor, then push the agent's load and KV events every interval.

KV events move from the NodeAgent into this module's backlog and leave it only when a
heartbeat carrying them is acknowledged, so a Conductor that is down for a while loses
none. The backlog is bounded (`max_backlog_events`): past it the oldest events are dropped
and counted, and the next heartbeat says how many (`num_dropped_events`), because from then
on the Conductor's index of this instance is no longer exact. Every join (the first, or
again after a Conductor restart) starts with an announcement of every block the shard
holds, from which the Conductor's index of this instance is rebuilt.
"""

import logging
import threading
import time
from collections import deque

import grpc

from agents.node.host_cpu import read_host_cpu
from agents.node.node import NodeAgent
from backend.policy.events import KvStored
from backend.policy.index import Tier
from backend.rpc import agent_pb2_grpc as pb_grpc
from backend.rpc.auth import call_metadata
from backend.rpc.convert import heartbeat_to_proto, join_to_proto
from backend.rpc.reports import Heartbeat, Join, KvEvent

logger = logging.getLogger(__name__)

FIRST_BACKOFF_S = 0.25  # between join attempts, doubling up to MAX_BACKOFF_S
MAX_BACKOFF_S = 5.0
RPC_TIMEOUT_S = 5.0
FINAL_TIMEOUT_S = 2.0
MAX_KEYS_PER_HEARTBEAT = 50_000  # keeps one heartbeat far below gRPC's 4 MiB message limit
ANNOUNCE_CHUNK = 4096  # keys per KvStored event of a join's announcement


class Heartbeats:
    """The background thread that joins `conductor` and sends heartbeats until `close`."""

    def __init__(
        self,
        agent: NodeAgent,
        conductor: str,
        *,
        control_address: str,
        interval_s: float,
        max_backlog_events: int,
    ) -> None:
        self.agent = agent
        self.conductor = conductor
        self.control_address = control_address
        self.interval_s = interval_s
        self.max_backlog_events = max_backlog_events
        self._channel = grpc.insecure_channel(conductor)
        self._stub = pb_grpc.ConductorStub(self._channel)
        self._metadata = call_metadata(agent.settings.secret)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeats", daemon=True)
        self._backlog: deque[KvEvent] = deque()  # unacknowledged, oldest first
        self._first_event_index = 0  # the number of _backlog[0] in the agent's life
        self._num_dropped = 0  # dropped since the last acknowledged heartbeat
        self._sequence = 0
        self._num_failures = 0  # heartbeats failed in a row
        self._beating = threading.Lock()  # one heartbeat at a time: the thread's or a flush
        self.is_joined = False

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop the thread; then, if joined, one final heartbeat with what is left."""
        self._stop.set()
        self._thread.join()
        if self.is_joined:
            try:
                while self._beat(is_final=True, timeout_s=FINAL_TIMEOUT_S):
                    pass
            except grpc.RpcError as error:
                logger.warning(
                    "final heartbeat to conductor %s failed (%s); %d KV event(s) undelivered",
                    self.conductor, _describe(error), len(self._backlog),
                )  # fmt: skip
        self._channel.close()

    def flush(self) -> None:
        """Send what is pending now (the service calls it before answering a call that made
        KV events), so the Conductor learns them before the answer, on this one channel."""
        if self.is_joined and not self._stop.is_set():
            while self._beat_logged():
                pass

    # -- the thread ------------------------------------------------------------------------
    def _run(self) -> None:
        num_join_failures = 0
        while not self._stop.is_set():
            if not self.is_joined:
                wait_s = min(FIRST_BACKOFF_S * 2**num_join_failures, MAX_BACKOFF_S)
                if self._join(wait_s):
                    num_join_failures = 0
                else:
                    num_join_failures += 1
                    self._stop.wait(wait_s)
                continue
            has_more = self._beat_logged()
            if not has_more:
                self._stop.wait(self.interval_s)

    def _join(self, retry_s: float) -> bool:
        agent, settings = self.agent, self.agent.settings
        stats = agent.stats()
        block_bytes = agent.shard.block_bytes
        join = Join(
            now_s=time.time(),
            instance_id=agent.instance_id,
            role=agent.role,
            control_address=self.control_address,
            data_address=agent.data_address,
            transport=settings.transport,
            preset=settings.preset,
            block_size=agent.block_size,
            kv_capacity_tokens=agent.kv_capacity_tokens,
            dram_capacity_bytes=stats.dram_capacity_blocks * block_bytes,
            ssd_capacity_bytes=stats.ssd_capacity_blocks * block_bytes,
            incarnation=agent.incarnation,
        )
        try:
            reply = self._stub.Join(
                join_to_proto(join), metadata=self._metadata, timeout=RPC_TIMEOUT_S
            )
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.UNAUTHENTICATED:  # type: ignore[attr-defined]
                logger.error(
                    "conductor %s refused to let %s join: wrong shared secret (%s); "
                    "retrying in %.2f s",
                    self.conductor, agent.instance_id, _describe(error), retry_s,
                )  # fmt: skip
            else:
                logger.warning(
                    "cannot join conductor %s (%s); serving anyway, retrying in %.2f s",
                    self.conductor, _describe(error), retry_s,
                )  # fmt: skip
            return False
        if not reply.accepted:
            logger.error(
                "conductor %s did not accept %s: %s; retrying in %.2f s",
                self.conductor, agent.instance_id, reply.message or "no reason", retry_s,
            )  # fmt: skip
            return False
        if reply.heartbeat_interval_s > 0:
            self.interval_s = reply.heartbeat_interval_s
        self._announce_holdings()
        self.is_joined = True
        logger.info(
            "agent %s joined conductor %s; a heartbeat every %.2f s",
            agent.instance_id, self.conductor, self.interval_s,
        )  # fmt: skip
        return True

    def _announce_holdings(self) -> None:
        """After a join, the first heartbeats carry every block the shard holds: a new
        Conductor (or one that had forgotten this agent) rebuilds its index from them. They
        replace the backlog, which they supersede (the Conductor forgot this instance's
        blocks when it joined)."""
        with self._beating:
            self.agent.take_events()
            held: dict[Tier, list[int]] = {}
            for key, tier in self.agent.shard.holdings().items():
                held.setdefault(tier, []).append(key)
            now_s = time.time()
            self._backlog = deque(
                KvStored(now_s, self.agent.instance_id, tuple(keys[i : i + ANNOUNCE_CHUNK]), tier)
                for tier, keys in held.items()
                for i in range(0, len(keys), ANNOUNCE_CHUNK)
            )
            self._num_dropped = 0
        if self._backlog:
            logger.info(
                "agent %s announces the %d block(s) it holds to conductor %s",
                self.agent.instance_id, sum(map(len, held.values())), self.conductor,
            )  # fmt: skip

    def _beat_logged(self) -> bool:
        """One heartbeat, its failure logged (once per outage); whether events remain."""
        try:
            has_more = self._beat(is_final=False, timeout_s=RPC_TIMEOUT_S)
        except grpc.RpcError as error:
            self._num_failures += 1
            if error.code() == grpc.StatusCode.UNAUTHENTICATED:  # type: ignore[attr-defined]
                logger.error(
                    "conductor %s refused a heartbeat (%s); joining again",
                    self.conductor, _describe(error),
                )  # fmt: skip
                self.is_joined = False
            elif self._num_failures == 1:
                logger.warning(
                    "heartbeat to conductor %s failed (%s); keeping %d unacknowledged KV "
                    "event(s) and retrying every %.2f s",
                    self.conductor, _describe(error), len(self._backlog), self.interval_s,
                )  # fmt: skip
            return False
        if self._num_failures:
            logger.info(
                "conductor %s reachable again after %d failed heartbeat(s)",
                self.conductor, self._num_failures,
            )  # fmt: skip
            self._num_failures = 0
        return has_more

    def _beat(self, *, is_final: bool, timeout_s: float) -> bool:
        """Send the load and the oldest unacknowledged events; whether more remain."""
        with self._beating:
            return self._beat_locked(is_final=is_final, timeout_s=timeout_s)

    def _beat_locked(self, *, is_final: bool, timeout_s: float) -> bool:
        self._collect()
        events: list[KvEvent] = []
        num_keys = 0
        for event in self._backlog:
            if events and num_keys + len(event.keys) > MAX_KEYS_PER_HEARTBEAT:
                break
            events.append(event)
            num_keys += len(event.keys)
        agent = self.agent
        self._sequence += 1
        prefill_samples, decode_steps = agent.take_samples()
        now_s = time.time()
        heartbeat = Heartbeat(
            now_s=now_s,
            instance_id=agent.instance_id,
            sequence=self._sequence,
            role=agent.role,
            draining=agent.draining,
            load=agent.report_load(),
            events=tuple(events),
            first_event_index=self._first_event_index,
            num_dropped_events=self._num_dropped,
            is_final=is_final,
            prefill_samples=tuple(prefill_samples),
            decode_steps=tuple(decode_steps),
            host_cpu=read_host_cpu(now_s),
        )
        reply = self._stub.Heartbeat(
            heartbeat_to_proto(heartbeat), metadata=self._metadata, timeout=timeout_s
        )
        if reply.rejoin:
            logger.warning(
                "conductor %s does not know %s (%s); joining again",
                self.conductor, agent.instance_id, reply.message or "no reason",
            )  # fmt: skip
            self.is_joined = False
            return False
        if not reply.acknowledged:
            return False
        for _ in events:
            self._backlog.popleft()
        self._first_event_index += len(events)
        self._num_dropped -= heartbeat.num_dropped_events
        return bool(self._backlog)

    def _collect(self) -> None:
        """Move the agent's new events into the backlog, dropping the oldest past the bound."""
        self._backlog.extend(self.agent.take_events())
        num_over = len(self._backlog) - self.max_backlog_events
        if num_over > 0:
            for _ in range(num_over):
                self._backlog.popleft()
            self._first_event_index += num_over
            self._num_dropped += num_over
            logger.warning(
                "KV event backlog for conductor %s over %d events: dropped the %d oldest "
                "(the conductor is told; its index of this instance is no longer exact)",
                self.conductor, self.max_backlog_events, num_over,
            )  # fmt: skip


def _describe(error: grpc.RpcError) -> str:
    code = error.code()  # type: ignore[attr-defined]
    return f"{code.name if code else 'UNKNOWN'}: {error.details()}"  # type: ignore[attr-defined]
