"""The REST boundary's one converter: API schemas <-> token ids, policy events and decisions.

Inbound, `prepare_*` turn a validated request body into a `PreparedRequest` (prompt token
ids, their block keys and the policy's `RequestArrived` fields), checking the configured
`ApiLimits` that a schema cannot know (prompt length in tokens, max_tokens, token-id range,
served models) and raising `InvalidRequest` with an OpenAI-style error body. Outbound, it
builds the response and stream bodies, the SSE framing, the 429 body of a policy `Reject`
and the error body of a schema validation failure.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel

from backend.api.schemas.common import Usage
from backend.api.schemas.errors import ErrorBody, ErrorDetail, RejectionBody, RejectionDetail
from backend.api.schemas.native import NativeRequest
from backend.api.schemas.openai import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    TopLogprob,
)
from backend.policy import Reject, RequestArrived, block_keys
from backend.runtime import Logprob
from backend.tokenizer import Tokenizer
from backend.traces.tokens import scaled_input_tokens, trace_token_ids

SSE_DONE = b"data: [DONE]\n\n"
# A temperature under this samples greedily (0): its distribution is one-hot already, and the
# agents divide fp32 logits by it, which overflows to inf/NaN for tiny values (say 1e-40).
MIN_SAMPLING_TEMPERATURE = 1e-6
# A token the model all but rules out has log-probability -inf in fp32, and JSON has no
# infinity: it is sent as this floor.
MIN_LOGPROB = -9999.0


@dataclass(frozen=True, slots=True)
class ApiLimits:
    """What the API accepts, from the settings: served models and token limits."""

    models: tuple[str, ...]
    max_input_tokens: int
    max_output_tokens: int
    vocab_size: int
    block_size: int

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("at least one served model is needed")
        for name in ("max_input_tokens", "max_output_tokens", "vocab_size", "block_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


class InvalidRequest(ValueError):
    """A request the schemas let through but the limits refuse; `body()` is what to send."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str = "invalid_value",
        status_code: int = 400,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.status_code = status_code

    def body(self) -> ErrorBody:
        return error_body(self.message, code=self.code, param=self.param)


@dataclass(frozen=True, slots=True, eq=False)
class PreparedRequest:
    """A request ready for the Conductor: prompt ids (int32, read-only) and their keys."""

    model: str
    token_ids: np.ndarray
    block_keys: tuple[int, ...]
    num_output_tokens: int
    stream: bool
    include_usage: bool
    temperature: float
    seed: int | None
    stop: tuple[str, ...]
    ignore_eos: bool
    ttft_slo_s: float | None
    tbt_slo_s: float | None
    logprobs: int | None = None  # None: none asked for; else alternatives per token
    echo_text: str = ""  # completions with `echo`: the prompt's text, sent first

    @property
    def num_input_tokens(self) -> int:
        return len(self.token_ids)

    def request_arrived(self, *, request_id: str, now_s: float) -> RequestArrived:
        return RequestArrived(
            now_s=now_s,
            request_id=request_id,
            block_keys=self.block_keys,
            num_input_tokens=self.num_input_tokens,
            num_output_tokens=self.num_output_tokens,
            ttft_slo_s=self.ttft_slo_s,
            tbt_slo_s=self.tbt_slo_s,
        )


def prepare_completion(
    body: CompletionRequest, *, tokenizer: Tokenizer, limits: ApiLimits
) -> PreparedRequest:
    model = _served_model(body.model, limits)
    if isinstance(body.prompt, str):
        token_ids = _as_ids(tokenizer.encode(body.prompt))
    else:
        token_ids = _checked_ids(body.prompt, limits, param="prompt")
    echo_text = ""
    if body.echo:
        prompt = body.prompt
        echo_text = prompt if isinstance(prompt, str) else tokenizer.decode(token_ids.tolist())
    return _prepared(
        model,
        token_ids,
        body.max_tokens,
        limits,
        prompt_param="prompt",
        stream=body.stream,
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
        temperature=body.temperature,
        seed=body.seed,
        stop=body.stop_sequences,
        logprobs=body.logprobs,
        echo_text=echo_text,
    )


def prepare_chat(
    body: ChatCompletionRequest, *, tokenizer: Tokenizer, limits: ApiLimits
) -> PreparedRequest:
    model = _served_model(body.model, limits)
    prompt = tokenizer.chat_prompt(
        [(message.template_role, message.text) for message in body.messages]
    )
    return _prepared(
        model,
        _as_ids(tokenizer.encode(prompt)),
        body.max_tokens,
        limits,
        prompt_param="messages",
        stream=body.stream,
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
        temperature=body.temperature,
        seed=body.seed,
        stop=body.stop_sequences,
        logprobs=(body.top_logprobs or 0) if body.logprobs else None,
    )


def prepare_native(
    body: NativeRequest, *, tokenizer: Tokenizer, limits: ApiLimits
) -> PreparedRequest:
    model = _served_model(body.model, limits) if body.model else limits.models[0]
    if body.text is not None:
        token_ids, param = _as_ids(tokenizer.encode(body.text)), "text"
    elif body.token_ids is not None:
        token_ids, param = _checked_ids(body.token_ids, limits, param="token_ids"), "token_ids"
    else:
        assert body.hash_ids is not None and body.input_length is not None  # the schema's rule
        num_tokens = scaled_input_tokens(body.input_length, length_scale=body.length_scale)
        _check_input_length(num_tokens, limits, param="input_length")
        token_ids = trace_token_ids(
            (body.hash_ids, body.input_length),
            vocab_size=limits.vocab_size,
            length_scale=body.length_scale,
        )
        param = "input_length"
    return _prepared(
        model,
        token_ids,
        body.max_tokens,
        limits,
        prompt_param=param,
        stream=body.stream,
        include_usage=True,
        temperature=body.temperature,
        seed=body.seed,
        stop=(),
        ignore_eos=body.ignore_eos,
        ttft_slo_s=body.ttft_slo_s,
        tbt_slo_s=body.tbt_slo_s,
    )


def _prepared(
    model: str,
    token_ids: np.ndarray,
    max_tokens: int,
    limits: ApiLimits,
    *,
    prompt_param: str,
    stream: bool,
    include_usage: bool,
    temperature: float,
    seed: int | None,
    stop: tuple[str, ...],
    ignore_eos: bool = False,
    ttft_slo_s: float | None = None,
    tbt_slo_s: float | None = None,
    logprobs: int | None = None,
    echo_text: str = "",
) -> PreparedRequest:
    if len(token_ids) == 0:
        raise InvalidRequest("the prompt has no tokens", param=prompt_param)
    _check_input_length(len(token_ids), limits, param=prompt_param)
    if max_tokens > limits.max_output_tokens:
        raise InvalidRequest(
            f"max_tokens is {max_tokens}, more than the limit of {limits.max_output_tokens}",
            param="max_tokens",
        )
    token_ids = np.ascontiguousarray(token_ids, dtype=np.int32)
    token_ids.setflags(write=False)
    return PreparedRequest(
        model=model,
        token_ids=token_ids,
        block_keys=tuple(block_keys(token_ids, limits.block_size)),
        num_output_tokens=max_tokens,
        stream=stream,
        include_usage=include_usage,
        temperature=temperature if temperature >= MIN_SAMPLING_TEMPERATURE else 0.0,
        seed=seed,
        stop=stop,
        ignore_eos=ignore_eos,
        ttft_slo_s=ttft_slo_s,
        tbt_slo_s=tbt_slo_s,
        logprobs=logprobs,
        echo_text=echo_text,
    )


def _served_model(model: str, limits: ApiLimits) -> str:
    if model not in limits.models:
        raise InvalidRequest(
            f"The model `{model}` does not exist; served: {', '.join(limits.models)}",
            param="model",
            code="model_not_found",
            status_code=404,
        )
    return model


def _check_input_length(num_tokens: int, limits: ApiLimits, *, param: str) -> None:
    if num_tokens > limits.max_input_tokens:
        limit = limits.max_input_tokens
        raise InvalidRequest(
            f"the prompt has {num_tokens} tokens, more than the limit of {limit}",
            param=param,
            code="context_length_exceeded",
        )


def _checked_ids(ids: Sequence[int], limits: ApiLimits, *, param: str) -> np.ndarray:
    _check_input_length(len(ids), limits, param=param)
    for index, token_id in enumerate(ids):
        if not 0 <= token_id < limits.vocab_size:
            raise InvalidRequest(
                f"{param}[{index}] is {token_id}, outside the vocabulary [0, {limits.vocab_size})",
                param=param,
            )
    return _as_ids(ids)


def _as_ids(ids: Sequence[int]) -> np.ndarray:
    return np.asarray(ids, dtype=np.int32)


# Outbound: bodies and stream events.


def usage(num_prompt_tokens: int, num_completion_tokens: int) -> Usage:
    return Usage(
        prompt_tokens=num_prompt_tokens,
        completion_tokens=num_completion_tokens,
        total_tokens=num_prompt_tokens + num_completion_tokens,
    )


def completion_response(
    *,
    request_id: str,
    model: str,
    created: int,
    text: str,
    finish_reason: str,
    usage: Usage,
    logprobs: CompletionLogprobs | None = None,
) -> CompletionResponse:
    """The whole answer: the last streamed chunk's shape, with its finish reason and usage."""
    return completion_chunk(
        request_id=request_id,
        model=model,
        created=created,
        text=text,
        finish_reason=finish_reason,
        usage=usage,
        logprobs=logprobs,
    )


def completion_chunk(
    *,
    request_id: str,
    model: str,
    created: int,
    text: str,
    finish_reason: str | None = None,
    usage: Usage | None = None,
    logprobs: CompletionLogprobs | None = None,
) -> CompletionResponse:
    choice = CompletionChoice(text=text, finish_reason=finish_reason, logprobs=logprobs)
    return CompletionResponse(
        id=request_id, created=created, model=model, choices=[choice], usage=usage
    )


def chat_response(
    *,
    request_id: str,
    model: str,
    created: int,
    text: str,
    finish_reason: str,
    usage: Usage,
    logprobs: ChatLogprobs | None = None,
) -> ChatCompletionResponse:
    message = AssistantMessage(content=text)
    choice = ChatChoice(message=message, finish_reason=finish_reason, logprobs=logprobs)
    return ChatCompletionResponse(
        id=request_id, created=created, model=model, choices=[choice], usage=usage
    )


def chat_chunk(
    *,
    request_id: str,
    model: str,
    created: int,
    text: str | None = None,
    is_first: bool = False,
    finish_reason: str | None = None,
    logprobs: ChatLogprobs | None = None,
) -> ChatCompletionChunk:
    """A streamed chat event: the first carries the role, the last the finish reason."""
    delta = ChatDelta(role="assistant" if is_first else None, content=text)
    choice = ChatChunkChoice(delta=delta, finish_reason=finish_reason, logprobs=logprobs)
    return ChatCompletionChunk(id=request_id, created=created, model=model, choices=[choice])


def chat_usage_chunk(
    *, request_id: str, model: str, created: int, usage: Usage
) -> ChatCompletionChunk:
    """The last event when the client asked for `stream_options.include_usage`."""
    return ChatCompletionChunk(id=request_id, created=created, model=model, choices=[], usage=usage)


@dataclass(slots=True)
class LogprobCursor:
    """Hands out a request's token log-probabilities in OpenAI's shapes as the text of their
    tokens is sent: `completion(n)` and `chat(n)` cover the tokens from the last call up to
    the first `n`. Both are None when the request asked for none."""

    tokenizer: Tokenizer
    tokens: Sequence[int]
    logprobs: Sequence[Logprob | None]
    wanted: bool
    sent: int = 0
    text_offset: int = 0  # completions: where the next token's text starts

    def completion(self, upto: int) -> CompletionLogprobs | None:
        if not self.wanted:
            return None
        body = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
        for token, logprob in self._take(upto):
            text = self._text(token)
            body.tokens.append(text)
            body.token_logprobs.append(_floor(logprob.logprob))
            body.top_logprobs.append({self._text(t): _floor(v) for t, v in logprob.top})
            body.text_offset.append(self.text_offset)
            self.text_offset += len(text)
        return body

    def chat(self, upto: int) -> ChatLogprobs | None:
        if not self.wanted:
            return None
        content = [
            ChatTokenLogprob(
                **self._top(token, logprob.logprob).model_dump(),
                top_logprobs=[self._top(t, v) for t, v in logprob.top],
            )
            for token, logprob in self._take(upto)
        ]
        return ChatLogprobs(content=content)

    def _take(self, upto: int) -> list[tuple[int, Logprob]]:
        upto = min(upto, len(self.tokens), len(self.logprobs))
        taken = [
            (token, logprob)
            for token, logprob in zip(
                self.tokens[self.sent : upto], self.logprobs[self.sent : upto], strict=True
            )
            if logprob is not None
        ]
        self.sent = max(self.sent, upto)
        return taken

    def _text(self, token: int) -> str:
        return self.tokenizer.token_bytes(token).decode("utf-8", errors="replace")

    def _top(self, token: int, logprob: float) -> TopLogprob:
        raw = self.tokenizer.token_bytes(token)
        return TopLogprob(
            token=raw.decode("utf-8", errors="replace"), logprob=_floor(logprob), bytes=list(raw)
        )


def _floor(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB) if not math.isnan(logprob) else MIN_LOGPROB


def sse_event(body: BaseModel) -> bytes:
    """One server-sent event carrying `body` as JSON (nulls kept, as OpenAI sends them)."""
    return b"data: " + body.model_dump_json().encode() + b"\n\n"


# Errors.


def error_body(
    message: str,
    *,
    error_type: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
    request_id: str | None = None,
) -> ErrorBody:
    detail = ErrorDetail(
        message=message, type=error_type, code=code, param=param, request_id=request_id
    )
    return ErrorBody(error=detail)


# The longest wait a rejection tells a client. The policy's hint grows with the overload it
# measured against the request's SLO, so a tiny SLO (say 5e-324 s, which the schema allows)
# makes it infinite: clients get "an hour" then, never a 500 from an unrenderable value.
MAX_RETRY_AFTER_S = 3600.0


def rejection_response(reject: Reject) -> tuple[RejectionBody, dict[str, str]]:
    """The 429 body of a policy rejection and its headers (Retry-After in whole seconds)."""
    retry_after_s = retry_after_hint(reject.retry_after_s)
    detail = RejectionDetail(
        message=reject.message,
        code=reject.reason,
        reason=reject.reason,
        stage=reject.stage,
        retry_after_s=retry_after_s,
        request_id=reject.request_id,
    )
    return RejectionBody(error=detail), {"Retry-After": retry_after_header(retry_after_s)}


def retry_after_hint(retry_after_s: float) -> float:
    """The policy's hint as a client gets it: finite, in [0, MAX_RETRY_AFTER_S]; NaN is 1 s."""
    if math.isnan(retry_after_s):
        return 1.0
    return min(max(retry_after_s, 0.0), MAX_RETRY_AFTER_S)


def retry_after_header(retry_after_s: float) -> str:
    # HTTP's Retry-After takes whole seconds; round up, and never tell a client "0".
    return str(max(1, math.ceil(retry_after_hint(retry_after_s))))


def validation_error_body(errors: Sequence[Mapping[str, object]]) -> ErrorBody:
    """One error body for pydantic/FastAPI validation errors (`exc.errors()`).

    The message lists every problem as `field: what is wrong`; `param` names the first
    field. Unknown fields read as OpenAI's "Unrecognized request argument supplied".
    """
    problems: list[str] = []
    first_param: str | None = None
    for error in errors:
        location = [str(part) for part in error.get("loc", ()) if part != "body"]  # type: ignore[union-attr]
        param = ".".join(location) or None
        first_param = first_param or param
        if error.get("type") == "extra_forbidden":
            problems.append(f"Unrecognized request argument supplied: {param}")
            continue
        message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
        problems.append(f"{param}: {message}" if param else message)
    return error_body("; ".join(problems) or "invalid request", param=first_param)
