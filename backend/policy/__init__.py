"""The pure policy core: every scheduling decision kvcentric makes, as plain code.

Owns block keys, the cluster-wide prefix index, the cost model the Conductor believes,
the prefill schedulers (the paper's Algorithm 1 and its comparison baselines), decode
selection, admission, eviction order and the `ConductorCore` that both the live Conductor
and the digital twin drive. It must not import any I/O library (fastapi, sqlalchemy, grpc,
simpy, torch, streamlit, sockets, files, clocks) nor any other part of the project; an
import-linter contract in CI enforces that. Time arrives as `now_s` on every event.
"""

from backend.policy.blocks import block_keys, num_full_blocks
from backend.policy.config import PolicyConfig
from backend.policy.core import ConductorCore
from backend.policy.cost_model import CostModel, DecodeFit, LinkModel, PrefillFit
from backend.policy.effects import (
    CachePlan,
    DispatchDecode,
    DispatchPrefill,
    Effect,
    FailRequest,
    FetchSpan,
    Reject,
    Replicate,
)
from backend.policy.events import (
    AgentDraining,
    AgentJoined,
    AgentLeft,
    DecodeFinished,
    DecodeRejected,
    DecodeStarted,
    DecodeStep,
    Event,
    KvDemoted,
    KvEvicted,
    KvLost,
    KvStored,
    PrefillFinished,
    PrefillStarted,
    RequestArrived,
    RequestCancelled,
    RequestFailed,
    RequestRetried,
    Tick,
    TransferMeasured,
)
from backend.policy.index import PrefixIndex, Tier

__all__ = [
    "AgentDraining",
    "AgentJoined",
    "AgentLeft",
    "CachePlan",
    "ConductorCore",
    "CostModel",
    "DecodeFinished",
    "DecodeFit",
    "DecodeRejected",
    "DecodeStarted",
    "DecodeStep",
    "DispatchDecode",
    "DispatchPrefill",
    "Effect",
    "Event",
    "FailRequest",
    "FetchSpan",
    "KvDemoted",
    "KvEvicted",
    "KvLost",
    "KvStored",
    "LinkModel",
    "PolicyConfig",
    "PrefillFinished",
    "PrefillFit",
    "PrefillStarted",
    "PrefixIndex",
    "Reject",
    "Replicate",
    "RequestArrived",
    "RequestCancelled",
    "RequestFailed",
    "RequestRetried",
    "Tick",
    "Tier",
    "TransferMeasured",
    "block_keys",
    "num_full_blocks",
]
