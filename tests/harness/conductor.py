"""HarnessConductor: a tiny Conductor service on loopback that records joins and heartbeats.

It stands in for the backend's Conductor service (a later issue) the way tests/harness/agents
drives agents: the same proto, the same secret check. `stop()` and `start()` again keep the
port and the records, like a Conductor restarting from its database.
"""

import threading
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc

from backend.cli.children import free_port
from backend.rpc import agent_pb2 as pb
from backend.rpc import agent_pb2_grpc as pb_grpc
from backend.rpc.auth import SecretInterceptor
from backend.rpc.convert import heartbeat_from_proto, join_from_proto
from backend.rpc.reports import Heartbeat, Join


class HarnessConductor(pb_grpc.ConductorServicer):
    """Accepts every join; acknowledges heartbeats of joined instances, else asks to rejoin."""

    def __init__(self, secret: str, *, heartbeat_interval_s: float = 0.0) -> None:
        self.secret = secret
        self.heartbeat_interval_s = heartbeat_interval_s
        self.joins: list[Join] = []
        self.heartbeats: list[Heartbeat] = []
        self.port = 0
        self._changed = threading.Condition()
        self._server: grpc.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "HarnessConductor":
        if not self.port:  # kept across stop() and start(): agents were given the address
            self.port = free_port()
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="conductor"),
            interceptors=[SecretInterceptor(self.secret)],
            options=[("grpc.so_reuseport", 0)],
        )
        self.port = server.add_insecure_port(self.address)
        pb_grpc.add_ConductorServicer_to_server(self, server)
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0).wait()
            self._server = None

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
        """Wait until `predicate()` holds (checked whenever a join or heartbeat arrives)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            return self._changed.wait_for(predicate, max(0.0, deadline - time.monotonic()))

    def heartbeats_of(self, instance_id: str) -> list[Heartbeat]:
        with self._changed:
            return [beat for beat in self.heartbeats if beat.instance_id == instance_id]

    # -- the service -----------------------------------------------------------------------
    def Join(self, request: pb.JoinRequest, context: Any) -> Any:
        try:
            join = join_from_proto(request)
        except ValueError as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        with self._changed:
            self.joins.append(join)
            self._changed.notify_all()
        return pb.JoinReply(accepted=True, heartbeat_interval_s=self.heartbeat_interval_s)

    def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> Any:
        try:
            heartbeat = heartbeat_from_proto(request)
        except ValueError as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        with self._changed:
            if all(join.instance_id != heartbeat.instance_id for join in self.joins):
                return pb.HeartbeatReply(rejoin=True, message="unknown instance")
            self.heartbeats.append(heartbeat)
            self._changed.notify_all()
        return pb.HeartbeatReply(acknowledged=True)
