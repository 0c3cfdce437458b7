"""The Conductor gRPC service the agents call (Join, Heartbeat): converts and delegates."""

from typing import TYPE_CHECKING, Any

import grpc

from backend.rpc import agent_pb2 as pb
from backend.rpc import agent_pb2_grpc as pb_grpc
from backend.rpc.convert import heartbeat_from_proto, join_from_proto

if TYPE_CHECKING:
    from backend.runtime.runtime import ConductorRuntime


class ConductorService(pb_grpc.ConductorServicer):
    def __init__(self, runtime: "ConductorRuntime") -> None:
        self._runtime = runtime

    def Join(self, request: pb.JoinRequest, context: Any) -> pb.JoinReply:
        try:
            join = join_from_proto(request)
        except ValueError as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        accepted, message = self._runtime.on_join(join)
        return pb.JoinReply(
            accepted=accepted,
            heartbeat_interval_s=self._runtime.heartbeat_interval_s,
            message=message,
        )

    def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> pb.HeartbeatReply:
        try:
            heartbeat = heartbeat_from_proto(request)
        except ValueError as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        if not self._runtime.on_heartbeat(heartbeat):
            return pb.HeartbeatReply(rejoin=True, message="unknown instance: join first")
        return pb.HeartbeatReply(acknowledged=True)
