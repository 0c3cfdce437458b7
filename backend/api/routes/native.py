"""The native API: POST /v1/native/requests (text, token ids or trace hash ids, with SLO
overrides) and GET /v1/requests/{id} (a request's record while this process knows it)."""

from collections.abc import AsyncIterator

from fastapi import APIRouter, HTTPException
from fastapi.responses import StreamingResponse

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
from backend.runtime import RequestStream

router = APIRouter(prefix="/v1", tags=["native"])

_ERRORS = SUBMIT_ERRORS


@router.post(
    "/native/requests",
    summary="Submit a request as text, token ids or trace hash ids; `stream: true` for SSE",
    response_model=NativeResponse,
    responses={**_ERRORS, 200: streamed(NativeChunk)},
)
async def create_native_request(body: NativeRequest, principal: ApiKey, served: ServedDep):
    prepared = prepare_native(body, tokenizer=served.tokenizer, limits=served.limits)
    request_id = new_request_id("req")
    stream = await submit(served, prepared, request_id=request_id, endpoint="native")
    if prepared.stream:

        async def events() -> AsyncIterator[bytes]:
            async for token in relay(served, stream):
                text = served.tokenizer.token_text(token)
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
    tokens = await collect(served, stream)
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
async def get_request(request_id: str, principal: ApiKey, served: ServedDep) -> RequestRecord:
    stream = served.runtime.request(request_id)
    if stream is None or request_id not in served.submitted:
        raise HTTPException(
            404, detail={"message": f"no request {request_id!r}", "code": "request_not_found"}
        )
    return _record(served, stream)


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
