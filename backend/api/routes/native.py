"""The native API: POST /v1/native/requests (text, token ids or trace hash ids, with SLO
overrides) and GET /v1/requests/{id} (a request's record: from memory while this process
remembers it, else from the database)."""

from collections.abc import AsyncIterator

from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session, sessionmaker

from backend.api.auth import ApiKey
from backend.api.routes.serving import (
    SUBMIT_ERRORS,
    Served,
    ServedDep,
    collect,
    ended_badly,
    finish_reason,
    new_request_id,
    relay,
    stream_error_event,
    streamed,
    submit,
)
from backend.api.schemas import (
    DecisionSummary,
    NativeChunk,
    NativeOutput,
    NativeRequest,
    NativeResponse,
    Outcome,
    RequestRecord,
    RequestTimings,
)
from backend.api.schemas.convert import SSE_DONE, prepare_native, sse_event, usage
from backend.db import request_log
from backend.db.records import DecisionRecord
from backend.db.records import RequestRecord as StoredRequest
from backend.runtime import RequestStream

router = APIRouter(prefix="/v1", tags=["native"])

_ERRORS = SUBMIT_ERRORS


@router.post(
    "/native/requests",
    summary="Submit a request as text, token ids or trace hash ids; `stream: true` for SSE",
    response_model=NativeResponse,
    responses={**_ERRORS, 200: streamed(NativeChunk)},
)
async def create_native_request(
    body: NativeRequest, principal: ApiKey, served: ServedDep, request: Request
):
    prepared = prepare_native(body, tokenizer=served.tokenizer, limits=served.limits)
    request_id = new_request_id("req")
    stream = await submit(
        served, prepared, request_id=request_id, endpoint="native", principal=principal
    )
    if prepared.stream:

        async def events() -> AsyncIterator[bytes]:
            decoder = served.tokenizer.stream_decoder()
            async for token in relay(served, stream):
                text = decoder.feed(token)
                yield sse_event(NativeChunk(id=request_id, token_ids=[token], text=text))
            if ended_badly(stream) is not None:
                yield stream_error_event(stream)
            else:
                last = NativeChunk(
                    id=request_id, token_ids=[], text="", finish_reason=finish_reason(stream)
                )
                yield sse_event(last)
            yield SSE_DONE

        return StreamingResponse(events(), media_type="text/event-stream")
    tokens = await collect(served, stream, request)
    failure = ended_badly(stream)
    if failure is not None:
        return failure
    record = _record(served, stream)
    output = NativeOutput(
        text=served.tokenizer.decode(tokens), token_ids=tokens, finish_reason=finish_reason(stream)
    )
    return NativeResponse(
        **record.model_dump(), output=output, usage=usage(prepared.num_input_tokens, len(tokens))
    )


@router.get(
    "/requests/{request_id}",
    summary="A request's record: state, decision, timings and outcome",
    responses={401: _ERRORS[401], 404: _ERRORS[404]},
)
async def get_request(
    request_id: str, principal: ApiKey, served: ServedDep, request: Request
) -> RequestRecord:
    """From memory while this process remembers the request, else from the database (older
    requests, and those served before a restart)."""
    stream = served.runtime.request(request_id)
    if stream is not None and request_id in served.submitted:
        return _record(served, stream)
    sessions = getattr(request.app.state, "sessions", None)
    if sessions is not None:
        stored, decisions = await run_in_threadpool(_read_stored, served, sessions, request_id)
        if stored is not None:
            return _stored_record(served, stored, decisions)
    raise HTTPException(
        404, detail={"message": f"no request {request_id!r}", "code": "request_not_found"}
    )


def _read_stored(
    served: Served, sessions: sessionmaker[Session], request_id: str
) -> tuple[StoredRequest | None, list[DecisionRecord]]:
    served.runtime.flush_records()
    with sessions() as session:
        stored = request_log.get_request(session=session, request_id=request_id)
        decisions = request_log.list_decisions(session=session, request_id=request_id)
    return stored, decisions


def _stored_record(
    served: Served, stored: StoredRequest, decisions: list[DecisionRecord]
) -> RequestRecord:
    """A request's record as the database has it (the model is the one served)."""
    outcome = stored.outcome
    decision = None
    if decisions:
        chosen = decisions[-1]
        decision = DecisionSummary(
            prefill_instance_id=chosen.prefill_instance_id,
            decode_instance_id=chosen.decode_instance_id,
            num_reused_tokens=chosen.num_reused_tokens,
            num_transferred_tokens=chosen.num_fetch_blocks * served.limits.block_size,
            fetch_source_instance_id=chosen.fetch_source_instance_id,
            estimated_ttft_s=chosen.estimated_ttft_s,
        )
    ended = None
    if outcome is not None:
        stage = outcome.stage if outcome.state == "rejected" else None
        generated = outcome.num_generated_tokens or 0
        ended = Outcome(
            state=outcome.state,
            reason=outcome.reason,
            stage=stage if stage in ("admission", "decode") else None,  # type: ignore[arg-type]
            message=outcome.message,
            finish_reason=(
                ("length" if generated >= stored.num_output_tokens else "stop")
                if outcome.state == "completed"
                else None
            ),
        )
    ttft_s = outcome.ttft_s if outcome is not None else None
    arrived_at_s = stored.arrival_time_s
    timings = RequestTimings(
        arrived_at_s=arrived_at_s,
        first_token_at_s=arrived_at_s + ttft_s if ttft_s is not None else None,
        finished_at_s=outcome.finished_time_s if outcome is not None else None,
        ttft_s=ttft_s,
        mean_tbt_s=outcome.tbt_mean_s if outcome is not None else None,
        max_tbt_s=outcome.tbt_max_s if outcome is not None else None,
    )
    return RequestRecord(
        id=stored.request_id,
        model=served.limits.models[0],
        state=outcome.state if outcome is not None else ("prefilling" if decisions else "queued"),
        num_input_tokens=stored.num_input_tokens,
        num_output_tokens=stored.num_output_tokens,
        num_generated_tokens=(outcome.num_generated_tokens or 0) if outcome is not None else 0,
        ttft_slo_s=stored.ttft_slo_s or served.default_ttft_slo_s,
        tbt_slo_s=stored.tbt_slo_s or served.default_tbt_slo_s,
        timings=timings,
        decision=decision,
        outcome=ended,
    )


def _record(served: Served, stream: RequestStream) -> RequestRecord:
    submitted = served.submitted[stream.request_id]
    outcome = stream.outcome
    if outcome is not None:
        state = outcome.state
    elif stream.stage == "decode":
        state = "decoding"
    else:
        state = "prefilling" if stream.decisions else "queued"
    decision = None
    if stream.decisions:
        chosen = stream.decisions[-1]
        plan = chosen.plan
        fetch = plan.fetch
        decision = DecisionSummary(
            prefill_instance_id=chosen.instance_id,
            decode_instance_id=chosen.decode_instance_id,
            num_reused_tokens=plan.num_reused_tokens,
            num_transferred_tokens=len(fetch.keys) * served.limits.block_size if fetch else 0,
            fetch_source_instance_id=fetch.source_instance_id if fetch else None,
            estimated_ttft_s=chosen.estimated_ttft_s,
        )
    ended = None
    if outcome is not None:
        stage = outcome.stage if outcome.state == "rejected" else None
        ended = Outcome(
            state=outcome.state,
            reason=outcome.reason,
            stage=stage if stage in ("admission", "decode") else None,  # type: ignore[arg-type]
            message=outcome.message,
            finish_reason=finish_reason(stream) if outcome.state == "completed" else None,
        )
    ttft_s = outcome.ttft_s if outcome is not None else None
    timings = RequestTimings(
        arrived_at_s=submitted.arrived_at_s,
        first_token_at_s=submitted.arrived_at_s + ttft_s if ttft_s is not None else None,
        finished_at_s=(
            submitted.arrived_at_s + outcome.finished_time_s - stream.arrival_s
            if outcome is not None
            else None
        ),
        ttft_s=ttft_s,
        mean_tbt_s=outcome.tbt_mean_s if outcome is not None else None,
        max_tbt_s=outcome.tbt_max_s if outcome is not None else None,
    )
    return RequestRecord(
        id=stream.request_id,
        model=submitted.model,
        state=state,
        num_input_tokens=submitted.num_input_tokens,
        num_output_tokens=submitted.max_tokens,
        num_generated_tokens=len(stream.tokens),
        ttft_slo_s=submitted.ttft_slo_s,
        tbt_slo_s=submitted.tbt_slo_s,
        timings=timings,
        decision=decision,
        outcome=ended,
    )
