"""REST schemas and their converter: validation messages, OpenAI client shapes, traces, 429."""

import json

import numpy as np
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion
from openai.types.chat import ChatCompletionChunk as OpenAIChatCompletionChunk
from pydantic import BaseModel, ValidationError

from backend.api.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    NativeRequest,
    RequestRecord,
)
from backend.api.schemas.convert import (
    SSE_DONE,
    ApiLimits,
    InvalidRequest,
    chat_chunk,
    chat_response,
    chat_usage_chunk,
    completion_chunk,
    completion_response,
    prepare_chat,
    prepare_completion,
    prepare_native,
    rejection_response,
    sse_event,
    usage,
    validation_error_body,
)
from backend.policy import Reject, RequestArrived, block_keys
from backend.tokenizer import SyntheticTokenizer, apply_chat_template
from backend.traces.tokens import trace_token_ids

LIMITS = ApiLimits(
    models=("tiny",), max_input_tokens=4096, max_output_tokens=512, vocab_size=32000, block_size=16
)
TOKENIZER = SyntheticTokenizer(32000)


def _error_messages(model: type[BaseModel], body: dict) -> str:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(body)
    return validation_error_body(caught.value.errors()).error.message


# Completions.


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [("Hello", "Hello"), (["Hello"], "Hello"), ([1, 2, 3], [1, 2, 3])],
)
def test_completion_prompt_forms(prompt: object, expected: object) -> None:
    body = CompletionRequest.model_validate({"model": "tiny", "prompt": prompt})
    assert body.prompt == expected
    assert body.max_tokens == 16
    assert not body.stream


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"model": "tiny", "prompt": ""}, "prompt: prompt must not be empty"),
        ({"model": "tiny", "prompt": []}, "prompt: prompt must not be empty"),
        ({"model": "tiny", "prompt": ["a", "b"]}, "must hold exactly one, got 2"),
        ({"model": "tiny", "prompt": [[1, 2]]}, "batched token prompts are not supported"),
        ({"model": "tiny", "prompt": [1, "a"]}, "prompt must be a string, a list of one"),
        ({"model": "tiny", "prompt": [1, True]}, "prompt must be a string, a list of one"),
        ({"model": "tiny", "prompt": 7}, "prompt must be a string, a list of one"),
        ({"model": "tiny", "prompt": [1, -2]}, "prompt: prompt[1] is -2: token ids are >= 0"),
        ({"model": "tiny"}, "prompt: Field required"),
        ({"prompt": "x"}, "model: Field required"),
        ({"model": "tiny", "prompt": "x", "max_tokens": 0}, "max_tokens: Input should be greater"),
        ({"model": "tiny", "prompt": "x", "temperature": 3}, "temperature: Input should be less"),
        ({"model": "tiny", "prompt": "x", "n": 2}, "n: Input should be 1"),
        (
            {"model": "tiny", "prompt": "x", "echo": True, "logprobs": 1},
            "echo with logprobs is not supported",
        ),
        ({"model": "tiny", "prompt": "x", "logprobs": 6}, "logprobs: Input should be less"),
        ({"model": "tiny", "prompt": "x", "logprobs": -1}, "logprobs: Input should be greater"),
        ({"model": "tiny", "prompt": "x", "stop": ["a"] * 5}, "at most 4 stop sequences, got 5"),
        (
            {"model": "tiny", "prompt": "x", "bogus": 1},
            "Unrecognized request argument supplied: bogus",
        ),
    ],
)
def test_completion_request_refusals(body: dict, message: str) -> None:
    assert message in _error_messages(CompletionRequest, body)


def test_completion_accepts_and_ignores_openai_sampling_fields() -> None:
    body = CompletionRequest.model_validate(
        {
            "model": "tiny",
            "prompt": "x",
            "top_p": 0.9,
            "presence_penalty": 0.1,
            "frequency_penalty": 0.2,
            "logit_bias": {"50256": -100},
            "n": 1,
            "best_of": 1,
            "user": "u1",
            "stop": "\n",
            "seed": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    prepared = prepare_completion(body, tokenizer=TOKENIZER, limits=LIMITS)
    assert prepared.stop == ("\n",)
    assert prepared.include_usage and prepared.stream and prepared.seed == 3


def test_validation_error_body_names_the_param() -> None:
    with pytest.raises(ValidationError) as caught:
        CompletionRequest.model_validate({"model": "tiny", "prompt": "x", "max_tokens": 0})
    # FastAPI puts "body" first in the location; it is not part of the param.
    errors = [{**error, "loc": ("body", *error["loc"])} for error in caught.value.errors()]
    body = validation_error_body(errors).model_dump()
    assert body["error"]["param"] == "max_tokens"
    assert body["error"]["type"] == "invalid_request_error"


# Chat.


def test_chat_request_and_template() -> None:
    body = ChatCompletionRequest.model_validate(
        {
            "model": "tiny",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}], "name": "ann"},
            ],
            "max_completion_tokens": 7,
        }
    )
    assert body.max_tokens == 7
    prepared = prepare_chat(body, tokenizer=TOKENIZER, limits=LIMITS)
    prompt = apply_chat_template([("system", "Be brief."), ("user", "Hi")])
    assert prepared.token_ids.tolist() == TOKENIZER.encode(prompt)
    assert prepared.num_output_tokens == 7


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"model": "tiny", "messages": []}, "messages: List should have at least 1 item"),
        (
            {"model": "tiny", "messages": [{"role": "tool", "content": "x"}]},
            "messages.0.role: role must be one of system, user, assistant or developer, got 'tool'",
        ),
        (
            {"model": "tiny", "messages": [{"role": "user"}]},
            "messages.0.content: Field required",
        ),
        (
            {"model": "tiny", "messages": [{"role": "user", "content": "x", "extra": 1}]},
            "Unrecognized request argument supplied: messages.0.extra",
        ),
        (
            {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "tools": [{}]},
            "tools are not supported: send none (or an empty list)",
        ),
        (
            {
                "model": "tiny",
                "messages": [{"role": "user", "content": "x"}],
                "response_format": {"type": "json_schema"},
            },
            "response_format type 'json_schema' is not supported",
        ),
        (
            {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
            "top_logprobs needs logprobs: true",
        ),
        (
            {
                "model": "tiny",
                "messages": [{"role": "user", "content": "x"}],
                "logprobs": True,
                "top_logprobs": 21,
            },
            "top_logprobs: Input should be less",
        ),
    ],
)
def test_chat_request_refusals(body: dict, message: str) -> None:
    assert message in _error_messages(ChatCompletionRequest, body)


def test_chats_sharing_a_system_prompt_share_block_keys() -> None:
    system = {"role": "system", "content": "You are the support bot of ACME. " * 20}

    def keys(question: str) -> tuple[int, ...]:
        messages = [system, {"role": "user", "content": question}]
        body = ChatCompletionRequest.model_validate({"model": "tiny", "messages": messages})
        return prepare_chat(body, tokenizer=TOKENIZER, limits=LIMITS).block_keys

    first, second = keys("Where is my order?"), keys("Cancel my subscription, please.")
    num_shared = len(TOKENIZER.encode(apply_chat_template([("system", system["content"])])))
    assert first[: num_shared // 16] == second[: num_shared // 16]
    assert first[num_shared // 16 :] != second[num_shared // 16 :]


# Limits checked by the converter.


def test_limits_refuse_long_prompts_big_max_tokens_unknown_models_and_ids() -> None:
    long_prompt = CompletionRequest(model="tiny", prompt=[1] * 4097)
    with pytest.raises(InvalidRequest, match="the prompt has 4097 tokens, more than the limit"):
        prepare_completion(long_prompt, tokenizer=TOKENIZER, limits=LIMITS)
    big_output = CompletionRequest(model="tiny", prompt="x", max_tokens=513)
    with pytest.raises(InvalidRequest, match="max_tokens is 513, more than the limit of 512"):
        prepare_completion(big_output, tokenizer=TOKENIZER, limits=LIMITS)
    with pytest.raises(InvalidRequest, match=r"prompt\[1\] is 32000, outside the vocabulary"):
        prepare_completion(
            CompletionRequest(model="tiny", prompt=[5, 32000]), tokenizer=TOKENIZER, limits=LIMITS
        )
    with pytest.raises(InvalidRequest) as caught:
        prepare_completion(
            CompletionRequest(model="gpt-4", prompt="x"), tokenizer=TOKENIZER, limits=LIMITS
        )
    assert caught.value.status_code == 404
    assert caught.value.body().model_dump() == {
        "error": {
            "message": "The model `gpt-4` does not exist; served: tiny",
            "type": "invalid_request_error",
            "code": "model_not_found",
            "param": "model",
        }
    }


def test_completion_becomes_request_arrived() -> None:
    body = CompletionRequest(model="tiny", prompt=list(range(40)), max_tokens=9)
    prepared = prepare_completion(body, tokenizer=TOKENIZER, limits=LIMITS)
    arrived = prepared.request_arrived(request_id="r1", now_s=5.0)
    assert arrived == RequestArrived(
        now_s=5.0,
        request_id="r1",
        block_keys=tuple(block_keys(list(range(40)), 16)),
        num_input_tokens=40,
        num_output_tokens=9,
    )
    assert len(arrived.block_keys) == 2


# Native requests.


def test_native_trace_request_has_the_trace_tokens_and_keys() -> None:
    hash_ids, input_length = [11, 12, 13], 1100
    body = NativeRequest.model_validate(
        {
            "hash_ids": hash_ids,
            "input_length": input_length,
            "max_tokens": 30,
            "ttft_slo_s": 2.5,
            "tbt_slo_s": 0.1,
        }
    )
    prepared = prepare_native(body, tokenizer=TOKENIZER, limits=LIMITS)
    expected_ids = trace_token_ids((hash_ids, input_length))
    np.testing.assert_array_equal(prepared.token_ids, expected_ids)
    arrived = prepared.request_arrived(request_id="t1", now_s=0.0)
    assert arrived.block_keys == tuple(block_keys(expected_ids, 16))
    assert (arrived.num_input_tokens, arrived.num_output_tokens) == (1100, 30)
    assert (arrived.ttft_slo_s, arrived.tbt_slo_s) == (2.5, 0.1)
    assert prepared.model == "tiny"


def test_native_trace_requests_sharing_hash_ids_share_keys_exactly_that_far() -> None:
    def keys(hash_ids: list[int]) -> tuple[int, ...]:
        body = NativeRequest(hash_ids=hash_ids, input_length=512 * len(hash_ids))
        return prepare_native(body, tokenizer=TOKENIZER, limits=LIMITS).block_keys

    first, second = keys([1, 2, 3]), keys([1, 2, 4])
    assert first[:64] == second[:64]
    assert first[64] != second[64]


def test_native_length_scale_shrinks_the_prompt() -> None:
    body = NativeRequest(hash_ids=[1, 2], input_length=1024, length_scale=0.125)
    prepared = prepare_native(body, tokenizer=TOKENIZER, limits=LIMITS)
    assert prepared.num_input_tokens == 128


def test_native_text_and_token_ids() -> None:
    text = prepare_native(NativeRequest(text="hello there"), tokenizer=TOKENIZER, limits=LIMITS)
    assert text.token_ids.tolist() == TOKENIZER.encode("hello there")
    ids = prepare_native(
        NativeRequest(token_ids=[3, 4], ignore_eos=True), tokenizer=TOKENIZER, limits=LIMITS
    )
    assert ids.token_ids.tolist() == [3, 4]
    assert ids.ignore_eos


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "give exactly one of text, token_ids or hash_ids (with input_length), got none"),
        ({"text": "a", "token_ids": [1]}, "got text, token_ids"),
        ({"hash_ids": [1]}, "hash_ids need input_length"),
        ({"text": "a", "input_length": 3}, "input_length goes only with hash_ids"),
        (
            {"hash_ids": [1, 2], "input_length": 512},
            "hash_ids has 2 ids but input_length 512 needs 1 (one per 512-token block)",
        ),
        (
            {"hash_ids": [1], "input_length": 513},
            "hash_ids has 1 ids but input_length 513 needs 2",
        ),
        ({"hash_ids": [-1], "input_length": 3}, "hash_ids.0: Input should be greater than"),
        ({"text": "a", "ttft_slo_s": 0}, "ttft_slo_s: Input should be greater than 0"),
        ({"text": "a", "tbt_slo_s": -1}, "tbt_slo_s: Input should be greater than 0"),
        ({"text": ""}, "text: String should have at least 1 character"),
        ({"token_ids": []}, "token_ids: List should have at least 1 item"),
        ({"text": "a", "prompt": "b"}, "Unrecognized request argument supplied: prompt"),
    ],
)
def test_native_request_refusals(body: dict, message: str) -> None:
    assert message in _error_messages(NativeRequest, body)


def test_native_scaled_trace_prompt_over_the_limit_is_refused_before_generating() -> None:
    body = NativeRequest(hash_ids=list(range(9)), input_length=9 * 512 - 100)
    with pytest.raises(InvalidRequest, match="the prompt has 4508 tokens") as caught:
        prepare_native(body, tokenizer=TOKENIZER, limits=LIMITS)
    assert caught.value.code == "context_length_exceeded"


# Responses parse with the official openai client's types.


def _through_the_wire(body: BaseModel) -> dict:
    return json.loads(body.model_dump_json())


def test_completion_response_parses_as_openai_completion() -> None:
    body = completion_response(
        request_id="cmpl-1",
        model="tiny",
        created=1_700_000_000,
        text="ba be ",
        finish_reason="length",
        usage=usage(5, 2),
    )
    parsed = Completion.model_validate(_through_the_wire(body))
    assert parsed.choices[0].text == "ba be "
    assert parsed.choices[0].finish_reason == "length"
    assert parsed.usage is not None and parsed.usage.total_tokens == 7
    assert parsed.object == "text_completion"


def test_completion_stream_chunks_have_openai_shape() -> None:
    middle = _through_the_wire(
        completion_chunk(request_id="cmpl-1", model="tiny", created=1, text="ba ")
    )
    assert middle["choices"][0] == {
        "index": 0,
        "text": "ba ",
        "finish_reason": None,
        "logprobs": None,
    }
    last = completion_chunk(
        request_id="cmpl-1", model="tiny", created=1, text="", finish_reason="stop"
    )
    assert Completion.model_validate(_through_the_wire(last)).choices[0].finish_reason == "stop"


def test_chat_response_parses_as_openai_chat_completion() -> None:
    body = chat_response(
        request_id="chatcmpl-1",
        model="tiny",
        created=1,
        text="ba ",
        finish_reason="stop",
        usage=usage(3, 1),
    )
    parsed = ChatCompletion.model_validate(_through_the_wire(body))
    assert parsed.choices[0].message.role == "assistant"
    assert parsed.choices[0].message.content == "ba "
    assert parsed.object == "chat.completion"


def test_chat_chunks_parse_as_openai_chunks() -> None:
    chunks = [
        chat_chunk(request_id="c", model="tiny", created=1, text="", is_first=True),
        chat_chunk(request_id="c", model="tiny", created=1, text="ba "),
        chat_chunk(request_id="c", model="tiny", created=1, finish_reason="length"),
        chat_usage_chunk(request_id="c", model="tiny", created=1, usage=usage(3, 1)),
    ]
    parsed = [OpenAIChatCompletionChunk.model_validate(_through_the_wire(c)) for c in chunks]
    assert parsed[0].choices[0].delta.role == "assistant"
    assert parsed[1].choices[0].delta.content == "ba "
    assert parsed[2].choices[0].finish_reason == "length"
    assert parsed[3].choices == [] and parsed[3].usage is not None
    assert all(chunk.object == "chat.completion.chunk" for chunk in parsed)


def test_sse_framing() -> None:
    event = sse_event(chat_chunk(request_id="c", model="tiny", created=1, text="x"))
    assert event.startswith(b"data: {") and event.endswith(b"}\n\n")
    assert SSE_DONE == b"data: [DONE]\n\n"


def test_model_list_parses_as_openai_models() -> None:
    from openai.types import Model

    body = _through_the_wire(ModelList(data=[ModelCard(id="tiny", created=1)]))
    assert body["object"] == "list"
    assert Model.model_validate(body["data"][0]).owned_by == "kvcentric"


# Rejections.


def test_reject_becomes_a_429_body_with_retry_after() -> None:
    reject = Reject(
        request_id="r9",
        reason="ttft_slo",
        stage="admission",
        message="predicted TTFT 12.0 s exceeds the SLO of 10.0 s",
        retry_after_s=2.2,
    )
    body, headers = rejection_response(reject)
    assert headers == {"Retry-After": "3"}
    assert _through_the_wire(body) == {
        "error": {
            "message": "predicted TTFT 12.0 s exceeds the SLO of 10.0 s",
            "type": "overloaded",
            "code": "ttft_slo",
            "param": None,
            "reason": "ttft_slo",
            "stage": "admission",
            "retry_after_s": 2.2,
            "request_id": "r9",
        }
    }


@pytest.mark.parametrize(("retry_after_s", "header"), [(0.0, "1"), (0.2, "1"), (4.0, "4")])
def test_retry_after_is_whole_seconds_and_at_least_one(retry_after_s: float, header: str) -> None:
    reject = Reject("r", "tbt_slo", "decode", "m", retry_after_s)
    assert rejection_response(reject)[1]["Retry-After"] == header


def test_request_record_shape() -> None:
    record = RequestRecord.model_validate(
        {
            "id": "r1",
            "model": "tiny",
            "state": "rejected",
            "num_input_tokens": 10,
            "num_output_tokens": 5,
            "ttft_slo_s": 10.0,
            "tbt_slo_s": 0.5,
            "timings": {"arrived_at_s": 1.0, "finished_at_s": 1.001},
            "outcome": {"state": "rejected", "reason": "ttft_slo", "stage": "admission"},
        }
    )
    assert record.outcome is not None and record.outcome.stage == "admission"
    with pytest.raises(ValidationError):
        RequestRecord.model_validate({**record.model_dump(), "state": "lost"})
