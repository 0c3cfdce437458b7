"""The routes' shared serving path: submit a prepared request to the runtime off the event
loop, turn an admission rejection into 429, relay tokens to async code and record metrics.

The runtime's `RequestStream` blocks, so one relay thread per accepted request iterates it
and hands tokens to the event loop through an asyncio queue; it also records the outcome,
so metrics are right even when the client goes away mid-stream.
"""

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from backend.api.access_log import note_request_id
from backend.api.auth import Principal
from backend.api.schemas.convert import (
    ApiLimits,
    InvalidRequest,
    PreparedRequest,
    error_body,
    rejection_response,
)
from backend.api.schemas.errors import ErrorBody, RejectionBody
from backend.metrics import ConductorMetrics
from backend.policy.effects import Reject
from backend.runtime import ConductorRuntime, RequestLogUnavailable, RequestStream, Sampling
from backend.tokenizer import Tokenizer

DEFAULT_MODEL = "tiny"
DEFAULT_MAX_INPUT_TOKENS = 4096
DEFAULT_MAX_OUTPUT_TOKENS = 1024
VOCAB_SIZE = 32_000  # the agents' model presets

DISCONNECT_POLL_S = 0.25  # how often a whole answer's wait checks that its client is there


@dataclass(frozen=True, slots=True)
class Served:
    """What the routes need, set on `app.state.served` by `include_routes`."""

    runtime: ConductorRuntime
    limits: ApiLimits
    tokenizer: Tokenizer
    metrics: ConductorMetrics
    default_ttft_slo_s: float
    default_tbt_slo_s: float
    submitted: dict[str, "Submitted"]
    started_at: int = 0  # Unix time the API started serving (a model card's `created`)


@dataclass(frozen=True, slots=True)
class Submitted:
    """A request this API submitted: what the runtime's stream does not carry."""

    model: str
    created: int
    arrived_at_s: float  # Unix epoch
    num_input_tokens: int
    max_tokens: int
    ttft_slo_s: float
    tbt_slo_s: float


async def get_served(request: Request) -> Served:
    return request.app.state.served


ServedDep = Annotated[Served, Depends(get_served)]


# Refusals that say the cluster cannot serve at all (no agent of a role has joined, or every
# one is draining): 503 Service Unavailable, not 429, which tells a client it sent too much.
UNAVAILABLE_REASONS = frozenset({"no_prefill_instance", "no_decode_instance"})


def rejection_status(reject: Reject) -> int:
    return 503 if reject.reason in UNAVAILABLE_REASONS else 429


class Rejected(HTTPException):
    """An early rejection: 429 (503 when no instance of a role is there) with the rejection
    body and Retry-After."""

    def __init__(self, reject: Reject) -> None:
        body, headers = rejection_response(reject)
        status = rejection_status(reject)
        super().__init__(status_code=status, detail=body.error.message, headers=headers)
        self.body = body


async def on_rejected(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, Rejected)
    return JSONResponse(
        error.body.model_dump(), status_code=error.status_code, headers=error.headers
    )


async def on_invalid_request(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, InvalidRequest)
    return JSONResponse(error.body().model_dump(), status_code=error.status_code)


# Requests whose details this process keeps in memory; older ones are read from the database.
MAX_REMEMBERED_REQUESTS = 20_000


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


async def submit(
    served: Served,
    prepared: PreparedRequest,
    *,
    request_id: str,
    endpoint: str,
    principal: Principal | None = None,
) -> RequestStream:
    """Submit off the event loop; raises `Rejected` when admission refuses it. `principal`:
    who sent it (its API key's name goes into the request log)."""
    note_request_id(request_id)
    served.metrics.record_submitted(endpoint)
    ttft_slo_s = prepared.ttft_slo_s or served.default_ttft_slo_s
    tbt_slo_s = prepared.tbt_slo_s or served.default_tbt_slo_s
    while len(served.submitted) >= MAX_REMEMBERED_REQUESTS:  # the oldest first
        served.submitted.pop(next(iter(served.submitted)))
    served.submitted[request_id] = Submitted(
        model=prepared.model,
        created=int(time.time()),
        arrived_at_s=time.time(),
        num_input_tokens=prepared.num_input_tokens,
        max_tokens=prepared.num_output_tokens,
        ttft_slo_s=ttft_slo_s,
        tbt_slo_s=tbt_slo_s,
    )
    sampling = Sampling(
        temperature=prepared.temperature,
        seed=prepared.seed or 0,
        ignore_eos=prepared.ignore_eos,
        logprobs=prepared.logprobs is not None,
        top_logprobs=prepared.logprobs or 0,
    )
    # On the event loop: submit only decides and queues (agent RPCs and the request log run
    # on other threads), in tens of microseconds; a thread round trip would cost more.
    try:
        stream = served.runtime.submit(
            request_id,
            prepared.token_ids.tolist(),
            prepared.num_output_tokens,
            ttft_slo_s=prepared.ttft_slo_s,
            tbt_slo_s=prepared.tbt_slo_s,
            sampling=sampling,
            keys=prepared.block_keys,  # computed with the API's block size, the runtime's
            api_key_name=principal.name if principal is not None else None,
        )
    except RequestLogUnavailable as error:
        raise HTTPException(
            503,
            detail={"message": f"cannot record requests now: {error}", "code": "log_unavailable"},
            headers={"Retry-After": "5"},
        ) from None
    outcome = stream.outcome
    if outcome is not None and outcome.state == "rejected" and not stream.decisions:
        record_outcome(served.metrics, stream)
        raise Rejected(as_reject(stream))
    served.metrics.record_accepted(endpoint)
    return stream


def as_reject(stream: RequestStream) -> Reject:
    outcome = stream.outcome
    assert outcome is not None and outcome.state == "rejected"
    return Reject(
        request_id=stream.request_id,
        reason=outcome.reason or "rejected",
        stage="decode" if outcome.stage == "decode" else "admission",
        message=outcome.message or f"request rejected: {outcome.reason}",
        retry_after_s=stream.retry_after_s or 1.0,
    )


def record_outcome(metrics: ConductorMetrics, stream: RequestStream) -> None:
    outcome = stream.outcome
    assert outcome is not None
    metrics.record_outcome(outcome.state, reason=outcome.reason or "", stage=outcome.stage or "")
    if outcome.state == "rejected":
        metrics.record_rejection(as_reject(stream))
    if outcome.ttft_s is not None:
        metrics.observe_ttft(outcome.ttft_s)


async def relay(served: Served, stream: RequestStream) -> AsyncIterator[int]:
    """The stream's tokens, on the event loop (no thread per request); the outcome is set
    (and recorded) when this ends. Left before the end (the client went away: the server
    cancels the task that iterates this), the request is cancelled."""
    try:
        async for token in stream:
            yield token
    finally:
        if not stream.is_finished:
            served.runtime.cancel(stream.request_id, "client_disconnected")
        if stream.is_finished:
            record_outcome(served.metrics, stream)


async def until_disconnected(served: Served, stream: RequestStream, request: Request) -> None:
    """Cancel the request if its client disconnects first (a whole, non-streamed answer:
    nothing else notices that nobody waits for it any more). Run it as a task; cancel the
    task when the answer is complete."""
    while not stream.is_finished:
        if await request.is_disconnected():
            served.runtime.cancel(stream.request_id, "client_disconnected")
            return
        await asyncio.sleep(DISCONNECT_POLL_S)


@contextlib.asynccontextmanager
async def cancelled_on_disconnect(
    served: Served, stream: RequestStream, request: Request
) -> AsyncIterator[None]:
    """While the body runs, a client that disconnects cancels the request."""
    watcher = asyncio.create_task(until_disconnected(served, stream, request))
    try:
        yield
    finally:
        watcher.cancel()


async def collect(served: Served, stream: RequestStream, request: Request) -> list[int]:
    async with cancelled_on_disconnect(served, stream, request):
        return [token async for token in relay(served, stream)]


def finish_reason(stream: RequestStream) -> str:
    return "length" if len(stream.tokens) >= stream.max_tokens else "stop"


def ended_badly(stream: RequestStream) -> JSONResponse | None:
    """The error response of a request that did not complete (after it ended), else None."""
    outcome = stream.outcome
    assert outcome is not None
    if outcome.state == "completed":
        return None
    if outcome.state == "rejected":
        reject = as_reject(stream)
        body, headers = rejection_response(reject)
        return JSONResponse(
            body.model_dump(), status_code=rejection_status(reject), headers=headers
        )
    if outcome.state == "cancelled":
        body = error_body(
            f"request {stream.request_id} was cancelled: {outcome.reason}",
            error_type="timeout" if outcome.reason == "deadline" else "cancelled",
            code=f"cancelled_{outcome.reason}",
            request_id=stream.request_id,
        )
        status = 504 if outcome.reason == "deadline" else 499
        return JSONResponse(body.model_dump(exclude_none=True), status_code=status)
    body = error_body(
        f"request {stream.request_id} failed: {outcome.reason}",
        error_type="server_error",
        code="request_failed",
        request_id=stream.request_id,
    )
    return JSONResponse(body.model_dump(exclude_none=True), status_code=503)


def stream_error_event(stream: RequestStream) -> bytes:
    """The SSE event telling a streaming client its request did not complete."""
    response = ended_badly(stream)
    assert response is not None
    return b"data: " + bytes(response.body) + b"\n\n"


# The error answers every submission route documents in the OpenAPI schema.
SUBMIT_ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorBody, "description": "Invalid request"},
    401: {"model": ErrorBody, "description": "Missing or invalid API key"},
    404: {"model": ErrorBody, "description": "Unknown model or request"},
    422: {"model": ErrorBody, "description": "Malformed body"},
    429: {"model": RejectionBody, "description": "Rejected early (overload); see Retry-After"},
    503: {
        "model": ErrorBody,
        "description": "The request failed (e.g. its agent was lost; its id is in the body), "
        "the request log cannot take it now, or no prefill or decode instance is serving "
        "(a rejection body, reason no_prefill_instance or no_decode_instance, and Retry-After)",
    },
    504: {"model": ErrorBody, "description": "Cancelled: not finished by the request deadline"},
}


def streamed(chunk: type[BaseModel]) -> dict[str, object]:
    """The 200 answer's second form, with `stream: true`, for a route's `responses`: server-sent
    events whose `data` is one `chunk` as JSON (or, last, the error body of a request that did
    not complete), then `[DONE]`. FastAPI documents the JSON answer next to it."""
    payload = {"anyOf": [_inlined_schema(chunk), _inlined_schema(ErrorBody)]}
    data = {
        "type": "string",
        "if": {"const": "[DONE]"},
        "else": {"contentMediaType": "application/json", "contentSchema": payload},
    }
    event = {
        "type": "object",
        "description": f"One event: a {chunk.__name__} as JSON, an error body, or [DONE] (last).",
        "required": ["data"],
        "properties": {"data": data},
    }
    return {
        "description": "The answer; with `stream: true` as server-sent events",
        "content": {"text/event-stream": {"schema": event}},
    }


def _inlined_schema(model: type[BaseModel]) -> dict[str, object]:
    """`model`'s JSON schema as sent, its `$defs` inlined (an event's schema stands alone)."""
    schema = model.model_json_schema(mode="serialization")
    defs = schema.pop("$defs", {})

    def inline(node: object) -> object:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline(defs[ref.removeprefix("#/$defs/")])
            return {key: inline(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inline(item) for item in node]
        return node

    return inline(schema)  # type: ignore[return-value]
