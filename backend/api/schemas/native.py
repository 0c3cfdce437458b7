"""The native API: POST /v1/native/requests and the request record of GET /v1/requests/{id}.

A native request gives its prompt in exactly one of three forms: `text` (tokenised by the
built-in tokenizer), `token_ids`, or a trace row's `hash_ids` with `input_length` (replayed
exactly: each hash id stands for the same 512-token block in every request, see
`backend.traces.tokens`). It may override the SLOs for itself.
"""

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

from backend.api.schemas.common import (
    DEFAULT_MAX_TOKENS,
    FinishReason,
    MaxTokens,
    RequestBody,
    Seed,
    SloSeconds,
    Temperature,
    TokenId,
    Usage,
)
from backend.traces.loader import TRACE_BLOCK_SIZE

RequestState = Literal[
    "queued", "prefilling", "decoding", "completed", "rejected", "failed", "cancelled"
]
TerminalState = Literal["completed", "rejected", "failed", "cancelled"]


# "Exactly one prompt form", said in the OpenAPI document as well as checked: a branch holds
# when its field is present and not null, and exactly one branch may hold.
_ONE_PROMPT_FORM = {
    "oneOf": [
        {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
        for name in ("text", "token_ids", "hash_ids")
    ]
}


class NativeRequest(RequestBody):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_ONE_PROMPT_FORM)

    model: str | None = Field(default=None, min_length=1)
    text: str | None = Field(default=None, min_length=1)
    token_ids: list[TokenId] | None = Field(default=None, min_length=1)
    hash_ids: list[TokenId] | None = Field(default=None, min_length=1)
    input_length: StrictInt | None = Field(default=None, ge=1)
    length_scale: float = Field(
        default=1.0,
        gt=0.0,
        le=1.0,
        description="Shrinks a hash-id prompt for small machines, keeping prefixes exact.",
    )
    max_tokens: MaxTokens = DEFAULT_MAX_TOKENS
    ignore_eos: bool = Field(
        default=False, description="Generate exactly max_tokens (trace replay) even past EOS."
    )
    stream: bool = False
    temperature: Temperature = 1.0
    seed: Seed | None = None
    ttft_slo_s: SloSeconds | None = None
    tbt_slo_s: SloSeconds | None = None

    @model_validator(mode="after")
    def _check_prompt_form(self) -> "NativeRequest":
        given = [
            name for name in ("text", "token_ids", "hash_ids") if getattr(self, name) is not None
        ]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of text, token_ids or hash_ids (with input_length), "
                f"got {', '.join(given) if given else 'none'}"
            )
        if self.hash_ids is None:
            if self.input_length is not None:
                raise ValueError("input_length goes only with hash_ids")
            if self.length_scale != 1.0:
                raise ValueError("length_scale goes only with hash_ids")
            return self
        if self.input_length is None:
            raise ValueError("hash_ids need input_length")
        num_blocks_needed = math.ceil(self.input_length / TRACE_BLOCK_SIZE)
        if len(self.hash_ids) != num_blocks_needed:
            raise ValueError(
                f"hash_ids has {len(self.hash_ids)} ids but input_length {self.input_length} "
                f"needs {num_blocks_needed} (one per {TRACE_BLOCK_SIZE}-token block)"
            )
        return self


class RequestTimings(BaseModel):
    """Unix-epoch seconds of each step reached (null until then) and the derived latencies."""

    arrived_at_s: float
    prefill_started_at_s: float | None = None
    prefill_finished_at_s: float | None = None
    first_token_at_s: float | None = None
    finished_at_s: float | None = None
    ttft_s: float | None = None
    mean_tbt_s: float | None = None
    max_tbt_s: float | None = None


class DecisionSummary(BaseModel):
    """What the Conductor decided: instances, the cache plan and its TTFT estimate."""

    prefill_instance_id: str
    decode_instance_id: str
    num_reused_tokens: int
    num_transferred_tokens: int
    fetch_source_instance_id: str | None = None
    estimated_ttft_s: float


class Outcome(BaseModel):
    """How the request ended; `stage` is set for rejections only."""

    state: TerminalState
    reason: str | None = None
    stage: Literal["admission", "decode"] | None = None
    message: str | None = None
    finish_reason: FinishReason | None = None


class RequestRecord(BaseModel):
    """GET /v1/requests/{id}: a request's life as the Conductor recorded it."""

    id: str
    object: Literal["request"] = "request"
    model: str
    state: RequestState
    num_input_tokens: int
    num_output_tokens: int
    num_generated_tokens: int = 0
    ttft_slo_s: float
    tbt_slo_s: float
    timings: RequestTimings
    decision: DecisionSummary | None = None
    outcome: Outcome | None = None


class NativeOutput(BaseModel):
    text: str
    token_ids: list[int]
    finish_reason: FinishReason


class NativeResponse(RequestRecord):
    """The answer to a non-streamed native request: its record plus what it generated."""

    output: NativeOutput | None = None
    usage: Usage | None = None


class NativeChunk(BaseModel):
    """One SSE event of a streamed native request: the new token ids and their text."""

    id: str
    object: Literal["request.chunk"] = "request.chunk"
    token_ids: list[int]
    text: str
    finish_reason: FinishReason | None = None
