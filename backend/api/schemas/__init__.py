"""The REST API's request/response schemas (pydantic) and their one converter, `convert`.

Schemas describe JSON on the wire only; ORM models live in `backend/db/` and policy
dataclasses in `backend/policy/`. `convert.py` is the single place that maps between them.
"""

from backend.api.schemas.common import DEFAULT_MAX_TOKENS, MAX_TOKENS_CAP, Usage
from backend.api.schemas.errors import ErrorBody, ErrorDetail, RejectionBody, RejectionDetail
from backend.api.schemas.native import (
    DecisionSummary,
    NativeChunk,
    NativeOutput,
    NativeRequest,
    NativeResponse,
    Outcome,
    RequestRecord,
    RequestState,
    RequestTimings,
)
from backend.api.schemas.openai import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
)

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "MAX_TOKENS_CAP",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "ChatMessage",
    "CompletionRequest",
    "CompletionResponse",
    "DecisionSummary",
    "ErrorBody",
    "ErrorDetail",
    "ModelCard",
    "ModelList",
    "NativeChunk",
    "NativeOutput",
    "NativeRequest",
    "NativeResponse",
    "Outcome",
    "RejectionBody",
    "RejectionDetail",
    "RequestRecord",
    "RequestState",
    "RequestTimings",
    "Usage",
]
