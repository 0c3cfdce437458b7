"""The live Conductor runtime: drives the policy core with the wall clock over gRPC.

`ConductorRuntime` serves the agents' Conductor service (Join/Heartbeat), feeds the core
events as they happen, carries out its effects on the agents and ends every request in
exactly one terminal state. No REST here; the API layer submits through `submit()`.
"""

from backend.runtime.requests import Logprob, RequestStream, Sampling
from backend.runtime.runtime import AgentInfo, ConductorRuntime, RequestLogUnavailable

__all__ = [
    "AgentInfo",
    "ConductorRuntime",
    "Logprob",
    "RequestLogUnavailable",
    "RequestStream",
    "Sampling",
]
