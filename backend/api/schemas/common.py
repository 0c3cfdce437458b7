"""Field types and bounds shared by the API schemas (no I/O, no policy)."""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

# Hard bounds any deployment accepts; the configured, usually tighter, limits
# (max input/output tokens, vocab size) are checked in `convert.py`.
DEFAULT_MAX_TOKENS = 16
MAX_TOKENS_CAP = 131_072
MAX_STOP_SEQUENCES = 4

TokenId = Annotated[StrictInt, Field(ge=0)]
# No upper bound here: one limit, the configured max_output_tokens (at most MAX_TOKENS_CAP,
# backend/settings), checked in convert.py with one status (400) whatever the value.
MaxTokens = Annotated[StrictInt, Field(ge=1)]
Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
# The agents seed their generators with a signed 64-bit integer (agent.proto's int64).
Seed = Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)]
SloSeconds = Annotated[float, Field(gt=0.0, le=3600.0)]
FinishReason = Literal["stop", "length"]


class RequestBody(BaseModel):
    """A client's JSON body: unknown fields are refused, as OpenAI's API does."""

    model_config = ConfigDict(extra="forbid")


class StreamOptions(RequestBody):
    """OpenAI's `stream_options`: with `include_usage` a last chunk carries the usage."""

    include_usage: bool = False


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
