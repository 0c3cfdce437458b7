"""Error bodies: OpenAI's `{"error": {...}}` shape, and the 429 body of an early rejection."""

from typing import Literal

from pydantic import BaseModel, Field


class ErrorDetail(BaseModel):
    message: str
    type: str
    code: str | None = None
    param: str | None = None
    # Set when the error is about a request the Conductor took (GET /v1/requests/{id});
    # left out of the body otherwise.
    request_id: str | None = Field(default=None, exclude_if=lambda value: value is None)


class ErrorBody(BaseModel):
    """What every 4xx/5xx answers, e.g. `invalid_request_error` with the offending param."""

    error: ErrorDetail


class RejectionDetail(ErrorDetail):
    """Why the cluster refused the request: `code` is the reason, plus its stage.

    `retry_after_s` is the policy's hint; the Retry-After header carries it rounded up to
    whole seconds.
    """

    type: str = "overloaded"
    reason: str
    stage: Literal["admission", "decode"]
    retry_after_s: float
    request_id: str


class RejectionBody(BaseModel):
    """The body of HTTP 429."""

    error: RejectionDetail
