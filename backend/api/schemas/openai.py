"""OpenAI-compatible schemas: /v1/completions, /v1/chat/completions, /v1/models.

Field names follow OpenAI's API exactly so the official clients work unchanged. Requests
refuse unknown fields (OpenAI answers "Unrecognized request argument"), but accept these
OpenAI fields and ignore them: `top_p`, `presence_penalty`, `frequency_penalty`,
`logit_bias`, `user`; on chat `response_format` of type text, `tools` empty and
`tool_choice` none or auto (what many client libraries send by default), and the
`developer` role (served as system). Log-probabilities are real (the model's log-softmax at
each generated token, before temperature): `logprobs` (0-5 alternatives) on completions,
`logprobs` and `top_logprobs` (0-20) on chat. `echo` puts the prompt before the completion
(not with `logprobs`: the prompt's own are not computed). `n` and `best_of` are accepted only
as 1 and `suffix` only as null: other values are refused with a message that says what is not
supported.
"""

from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from backend.api.schemas.common import (
    DEFAULT_MAX_TOKENS,
    MAX_STOP_SEQUENCES,
    FinishReason,
    MaxTokens,
    RequestBody,
    Seed,
    StreamOptions,
    Temperature,
    TokenId,
    Usage,
)
from backend.tokenizer import ROLES

# "developer" is what newer OpenAI clients send for system instructions: served as system.
Role = Literal["system", "developer", "user", "assistant"]
Stop = str | list[str] | None
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's limits on alternatives per token
MAX_TOP_LOGPROBS = 20


class _SamplingFields(RequestBody):
    model: str = Field(min_length=1)
    max_tokens: MaxTokens = DEFAULT_MAX_TOKENS
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: Temperature = 1.0
    seed: Seed | None = None
    stop: Stop = None
    user: str | None = None
    n: Literal[1] = 1
    # Accepted and ignored (sampling is not what this system studies).
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, stop: Stop) -> Stop:
        if isinstance(stop, list) and len(stop) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences, got {len(stop)}")
        return stop

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionRequest(_SamplingFields):
    """POST /v1/completions. `prompt` is text, a list of one text, or a list of token ids."""

    # The constraints are in the document too (no empty prompt, one text at most), so a
    # client generated from it cannot build a prompt the server refuses.
    prompt: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=1)]
        | Annotated[list[TokenId], Field(min_length=1)]
    )
    best_of: Literal[1] = 1
    echo: bool = False
    # Each token's log-probability and this many most likely alternatives with theirs.
    logprobs: int | None = Field(default=None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    suffix: None = None

    @model_validator(mode="after")
    def _echo_without_logprobs(self) -> "CompletionRequest":
        if self.echo and self.logprobs is not None:
            raise ValueError(
                "echo with logprobs is not supported: the prompt's log-probabilities are not "
                "computed (the prefill keeps the last position's only)"
            )
        return self

    @field_validator("prompt", mode="before")
    @classmethod
    def _check_prompt_shape(cls, prompt: object) -> object:
        # Before pydantic's union, so a wrong shape gets one clear message, not three.
        if prompt == "" or prompt == [""] or prompt == []:
            raise ValueError("prompt must not be empty")
        if isinstance(prompt, list):
            if all(isinstance(item, str) for item in prompt):
                if len(prompt) != 1:
                    raise ValueError(
                        f"prompt as a list of strings must hold exactly one, got {len(prompt)} "
                        "(batched prompts are not supported)"
                    )
                return prompt
            if any(isinstance(item, list) for item in prompt):
                raise ValueError("batched token prompts are not supported: send one list of ids")
            if not all(isinstance(item, int) and not isinstance(item, bool) for item in prompt):
                raise ValueError("prompt must be a string, a list of one string or token ids")
            negative = next((index for index, item in enumerate(prompt) if item < 0), None)
            if negative is not None:
                raise ValueError(f"prompt[{negative}] is {prompt[negative]}: token ids are >= 0")
        elif not isinstance(prompt, str):
            raise ValueError("prompt must be a string, a list of one string or token ids")
        return prompt

    @field_validator("prompt")
    @classmethod
    def _unwrap_prompt(cls, prompt: str | list[str] | list[int]) -> str | list[int]:
        if isinstance(prompt, list) and isinstance(prompt[0], str):
            prompt = prompt[0]
        if prompt == "":
            raise ValueError("prompt must not be empty")
        return prompt


class TextPart(RequestBody):
    """One part of a message's content given as a list of parts (only text is supported)."""

    type: Literal["text"]
    text: str


class ChatMessage(RequestBody):
    role: Role
    content: str | list[TextPart]
    name: str | None = None  # accepted and ignored

    @field_validator("role", mode="before")
    @classmethod
    def _check_role(cls, role: object) -> object:
        if role not in (*ROLES, "developer"):
            raise ValueError(f"role must be one of {', '.join(ROLES)} or developer, got {role!r}")
        return role

    @property
    def template_role(self) -> str:
        """The role the chat template sees ("developer" is the system role's new name)."""
        return "system" if self.role == "developer" else self.role

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_SamplingFields):
    """POST /v1/chat/completions. `max_completion_tokens` (newer clients) wins if both set."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: MaxTokens | None = None
    logprobs: bool = False  # each token's log-probability with it
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    # Sent by many client libraries by default: plain text and no tools can be honoured.
    response_format: dict[str, object] | None = None
    tools: list[dict[str, object]] | None = None
    tool_choice: str | dict[str, object] | None = None
    parallel_tool_calls: bool | None = None

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> "ChatCompletionRequest":
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @field_validator("response_format")
    @classmethod
    def _only_text(cls, value: dict[str, object] | None) -> dict[str, object] | None:
        if value is not None and value.get("type") != "text":
            raise ValueError(
                f"response_format type {value.get('type')!r} is not supported (only 'text': "
                "this server does not constrain its output to JSON)"
            )
        return value

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, value: list[dict[str, object]] | None) -> list[dict[str, object]] | None:
        if value:
            raise ValueError("tools are not supported: send none (or an empty list)")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _no_tool_choice(cls, value: object) -> object:
        if value not in (None, "none", "auto"):
            raise ValueError("tool_choice must be 'none' or 'auto': tools are not supported")
        return value

    @model_validator(mode="after")
    def _take_max_completion_tokens(self) -> "ChatCompletionRequest":
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return self


# Responses. Null fields are sent as null, as OpenAI does.


class CompletionLogprobs(BaseModel):
    """Per generated token: its text, log-probability, most likely alternatives (text to
    log-probability) and where its text starts in the choice's text."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: FinishReason | None
    logprobs: CompletionLogprobs | None = None


class CompletionResponse(BaseModel):
    """The body of /v1/completions; with `stream` each SSE event is one of these too,
    `finish_reason` null until the last text chunk (OpenAI streams completions this way).
    """

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    """A generated token: its text, bytes and log-probability, and the most likely ones."""

    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: ChatLogprobs | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    """The first chunk carries the role, later ones the new text."""

    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: FinishReason | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    """One SSE event of a streamed chat; the usage chunk (include_usage) has no choices."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "kvcentric"


class ModelList(BaseModel):
    """GET /v1/models."""

    object: Literal["list"] = "list"
    data: list[ModelCard]
