"""The node agent process: gRPC control API over a prefill or decode worker, a pool shard
and the KV data plane.

Module map: `settings` (what the command line sets), `prefix` (gathering a plan's reused
blocks from the shard and peers), `handoff` (the KV a prefill pushes to a decode agent),
`decode_loop` (the decode worker's thread and token streams), `node` (NodeAgent: the
parts and the operations), `service` (the gRPC servicer), `heartbeat` (joining the
Conductor and pushing load and KV events to it), `main` (serving until SIGTERM),
`faults` (test-only fault injection, off unless KVC_FAULT_CORRUPT_FETCH=1).
"""

from agents.node.node import DispatchError, NodeAgent
from agents.node.settings import AgentSettings

__all__ = ["AgentSettings", "DispatchError", "NodeAgent"]
