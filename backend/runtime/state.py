"""What the runtime's parts share: the policy core, the joined agents and the requests, and
the one lock that guards them all.

Every event is fed to the core, and the in-memory part of its effects carried out, while
holding `lock`; agent calls, database writes and client wake-ups happen after it is let go.
"""

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from backend.metrics import ConductorMetrics
from backend.policy import ConductorCore, PolicyConfig
from backend.rpc import agent_pb2_grpc as pb_grpc
from backend.rpc.reports import AgentLoad, Join
from backend.runtime.requests import RequestStream

# Work a part found under the lock and must do after letting it go (close a stream, call an
# agent, export a metric), in order.
AfterWork = list[Callable[[], None]]


@dataclass(eq=False)
class AgentInfo:
    """A joined agent: its addresses, a stub to its Agent service, its last report."""

    join: Join
    last_seen_s: float
    channel: grpc.Channel  # for control calls from threads (drain, role, cancel, evict)
    stub: pb_grpc.AgentStub
    load: AgentLoad = field(default_factory=AgentLoad)
    # Our clock minus the agent's, as the least gap seen between a heartbeat's stamp and its
    # arrival (its delivery delay varies, by up to 0.1 s on a busy Conductor).
    clock_offset_s: float = math.inf
    draining: bool = False  # takes no new work (a role switch is under way)


class RuntimeState:
    """The core, the agents and the requests, guarded by `lock`; see the module doc."""

    def __init__(
        self, core: ConductorCore, config: PolicyConfig, clock: Callable[[], float]
    ) -> None:
        self.lock = threading.Lock()
        self.core = core
        self.config = config
        self.clock = clock
        self.agents: dict[str, AgentInfo] = {}
        self.requests: dict[str, RequestStream] = {}
        self.metrics: ConductorMetrics | None = None


def run_after(work: AfterWork) -> None:
    """Do the work collected under the lock (the lock no longer held)."""
    for job in work:
        job()
