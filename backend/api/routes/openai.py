"""OpenAI-compatible routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models.

With `stream: true` the answer is server-sent events in OpenAI's format, ending with
`data: [DONE]`; otherwise one JSON body once the request has ended.
"""

from collections.abc import AsyncIterator, Sequence

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse

from backend.api.auth import ApiKey
from backend.api.routes.serving import (
    SUBMIT_ERRORS,
    Served,
    ServedDep,
    cancelled_on_disconnect,
    ended_badly,
    finish_reason,
    new_request_id,
    relay,
    stream_error_event,
    streamed,
    submit,
)
from backend.api.schemas import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
)
from backend.api.schemas.convert import (
    SSE_DONE,
    LogprobCursor,
    chat_chunk,
    chat_response,
    chat_usage_chunk,
    completion_chunk,
    completion_response,
    prepare_chat,
    prepare_completion,
    sse_event,
    usage,
)
from backend.api.schemas.errors import ErrorBody
from backend.api.stops import StopText
from backend.runtime import RequestStream

router = APIRouter(prefix="/v1", tags=["openai"])

_ERRORS = SUBMIT_ERRORS
_SSE = "text/event-stream"


@router.get("/models", summary="The served models")
async def list_models(principal: ApiKey, served: ServedDep) -> ModelList:
    return ModelList(
        data=[ModelCard(id=name, created=served.started_at) for name in served.limits.models]
    )


@router.get(
    "/models/{model}",
    summary="One served model",
    responses={404: {"model": ErrorBody, "description": "Not a served model"}},
)
async def retrieve_model(model: str, principal: ApiKey, served: ServedDep) -> ModelCard:
    if model not in served.limits.models:
        served_names = ", ".join(served.limits.models)
        raise HTTPException(404, f"model {model!r} is not served here (served: {served_names})")
    return ModelCard(id=model, created=served.started_at)


@router.post(
    "/completions",
    summary="Text completion (OpenAI-compatible); `stream: true` for SSE",
    response_model=CompletionResponse,
    responses={**_ERRORS, 200: streamed(CompletionResponse)},
)
async def create_completion(
    body: CompletionRequest, principal: ApiKey, served: ServedDep, request: Request
):
    prepared = prepare_completion(body, tokenizer=served.tokenizer, limits=served.limits)
    request_id = new_request_id("cmpl")
    stream = await submit(
        served, prepared, request_id=request_id, endpoint="completions", principal=principal
    )
    created = served.submitted[request_id].created
    ids = {"request_id": request_id, "model": prepared.model, "created": created}
    if prepared.stream:

        async def events() -> AsyncIterator[bytes]:
            text_stream = _TextStream(served, stream, prepared.stop)
            cursor = _cursor(served, stream)
            if prepared.echo_text:
                yield sse_event(completion_chunk(**ids, text=prepared.echo_text))
            async for text in text_stream.deltas():
                logprobs = cursor.completion(text_stream.num_tokens)
                yield sse_event(completion_chunk(**ids, text=text, logprobs=logprobs))
            stop = text_stream.stop
            if not stop.stopped and ended_badly(stream) is not None:
                yield stream_error_event(stream)
            else:
                num_tokens = len(stream.tokens)
                reason = _finish_reason(stop, stream)
                logprobs = cursor.completion(text_stream.num_tokens)
                yield sse_event(
                    completion_chunk(**ids, text="", finish_reason=reason, logprobs=logprobs)
                )
                if prepared.include_usage:
                    used = usage(prepared.num_input_tokens, num_tokens)
                    yield sse_event(
                        CompletionResponse(
                            id=request_id,
                            created=created,
                            model=prepared.model,
                            choices=[],
                            usage=used,
                        )
                    )
            yield SSE_DONE

        return StreamingResponse(events(), media_type=_SSE)
    text, text_stream = await _whole_text(served, stream, prepared.stop, request)
    failure = ended_badly(stream)
    if failure is not None:
        return failure
    reason, tokens = _finish_reason(text_stream.stop, stream), stream.tokens
    return completion_response(
        **ids,
        text=prepared.echo_text + text,
        finish_reason=reason,
        usage=usage(prepared.num_input_tokens, len(tokens)),
        logprobs=_cursor(served, stream).completion(text_stream.num_tokens),
    )


@router.post(
    "/chat/completions",
    summary="Chat completion (OpenAI-compatible); `stream: true` for SSE",
    response_model=ChatCompletionResponse,
    responses={**_ERRORS, 200: streamed(ChatCompletionChunk)},
)
async def create_chat_completion(
    body: ChatCompletionRequest, principal: ApiKey, served: ServedDep, request: Request
) -> ChatCompletionResponse | JSONResponse | StreamingResponse:
    prepared = prepare_chat(body, tokenizer=served.tokenizer, limits=served.limits)
    request_id = new_request_id("chatcmpl")
    stream = await submit(
        served, prepared, request_id=request_id, endpoint="chat", principal=principal
    )
    created = served.submitted[request_id].created
    ids = {"request_id": request_id, "model": prepared.model, "created": created}
    if prepared.stream:

        async def events() -> AsyncIterator[bytes]:
            first: ChatCompletionChunk = chat_chunk(**ids, text="", is_first=True)
            yield sse_event(first)
            text_stream = _TextStream(served, stream, prepared.stop)
            cursor = _cursor(served, stream)
            async for text in text_stream.deltas():
                logprobs = cursor.chat(text_stream.num_tokens)
                yield sse_event(chat_chunk(**ids, text=text, logprobs=logprobs))
            stop = text_stream.stop
            if not stop.stopped and ended_badly(stream) is not None:
                yield stream_error_event(stream)
            else:
                reason, logprobs = _finish_reason(stop, stream), cursor.chat(text_stream.num_tokens)
                yield sse_event(chat_chunk(**ids, finish_reason=reason, logprobs=logprobs))
                if prepared.include_usage:
                    used = usage(prepared.num_input_tokens, len(stream.tokens))
                    yield sse_event(chat_usage_chunk(**ids, usage=used))
            yield SSE_DONE

        return StreamingResponse(events(), media_type=_SSE)
    text, text_stream = await _whole_text(served, stream, prepared.stop, request)
    failure = ended_badly(stream)
    if failure is not None:
        return failure
    reason, tokens = _finish_reason(text_stream.stop, stream), stream.tokens
    return chat_response(
        **ids,
        text=text,
        finish_reason=reason,
        usage=usage(prepared.num_input_tokens, len(tokens)),
        logprobs=_cursor(served, stream).chat(text_stream.num_tokens),
    )


class _TextStream:
    """A request's streamed text, token by token, cut at the first stop sequence (which ends
    the request there: its agents drop the rest); `num_tokens`: the tokens read so far (the
    last of them completed the stop sequence, when one was found)."""

    def __init__(self, served: Served, stream: RequestStream, stops: Sequence[str]) -> None:
        self.served, self.stream = served, stream
        self.stop = StopText(stops)
        self.num_tokens = 0

    async def deltas(self) -> AsyncIterator[str]:
        """The new text as tokens arrive; the tail the stop check held back comes last when
        the request completed."""
        served, stream, stop = self.served, self.stream, self.stop
        decoder = served.tokenizer.stream_decoder()
        async for token in relay(served, stream):
            self.num_tokens += 1
            if text := stop.feed(decoder.feed(token)):
                yield text
            if stop.stopped:
                served.runtime.finish_early(stream.request_id, "stop_sequence")
                return
        completed = stream.outcome is not None and stream.outcome.state == "completed"
        if completed and (text := stop.flush()):
            yield text


async def _whole_text(
    served: Served, stream: RequestStream, stops: Sequence[str], request: Request
) -> tuple[str, _TextStream]:
    """A whole answer's text, cut at the first stop sequence (the request ends there), and
    the _TextStream that says whether it was; a client that disconnects meanwhile cancels it."""
    text_stream = _TextStream(served, stream, stops)
    async with cancelled_on_disconnect(served, stream, request):
        text = "".join([delta async for delta in text_stream.deltas()])
    return text, text_stream


def _cursor(served: Served, stream: RequestStream) -> LogprobCursor:
    return LogprobCursor(
        served.tokenizer, stream.tokens, stream.logprobs, wanted=stream.sampling.logprobs
    )


def _finish_reason(stop: StopText, stream: RequestStream) -> str:
    return "stop" if stop.stopped else finish_reason(stream)
