"""Sends one planned request as a streamed native request and measures TTFT and token gaps.

The client is aiohttp's: the load generator shares the host with the cluster it measures
(`kvcentric up`, `twin validate`), so its CPU a request is CPU the agents do not get.
"""

import json
import time

import aiohttp

from backend.loadgen.plan import PlannedRequest
from backend.loadgen.results import RequestResult, summarize_gaps

NATIVE_PATH = "/v1/native/requests"
_SSE_DATA = "data: "
_SSE_DONE = "[DONE]"


async def send_request(
    client: aiohttp.ClientSession, planned: PlannedRequest, *, sent_s: float, base_url: str = ""
) -> RequestResult:
    """Send `planned` and read its stream to the end; every outcome becomes a result.
    `base_url`: the server's URL, path included (a Conductor behind a proxy's prefix),
    without its trailing slash; empty where the session has one.

    Times come from the monotonic clock at send: TTFT until the first token chunk, and one
    gap per later token chunk. Transport errors become `failed` with their message.
    """
    result = RequestResult(
        line=planned.line_number,
        sent_s=sent_s,
        status="failed",
        max_tokens=int(planned.body["max_tokens"]),  # type: ignore[call-overload]
    )
    start = time.monotonic()
    try:
        async with client.post(base_url + NATIVE_PATH, json=planned.body) as response:
            if response.status != 200:
                _on_error_response(result, response.status, await response.read(), response)
                return result
            await _read_stream(result, response, start)
    except (aiohttp.ClientError, TimeoutError) as error:
        result.status = "failed"
        result.message = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return result


async def _read_stream(
    result: RequestResult, response: aiohttp.ClientResponse, start: float
) -> None:
    last_token_at: float | None = None
    async for raw in response.content:  # one SSE line at a time
        line = raw.decode().rstrip("\r\n")
        if not line.startswith(_SSE_DATA):
            continue
        data = line[len(_SSE_DATA) :]
        if data == _SSE_DONE:
            break
        event = json.loads(data)
        if "error" in event:
            _on_error_detail(result, event["error"], retry_after=None)
            return
        result.id = event.get("id", result.id)
        if event.get("token_ids"):
            now = time.monotonic()
            if last_token_at is None:
                result.ttft_s = now - start
            else:
                result.tbt_gaps_s.append(now - last_token_at)
            last_token_at = now
            result.num_tokens += len(event["token_ids"])
        if event.get("finish_reason") is not None:
            result.status = "completed"
    if result.status != "completed":
        result.message = "the stream ended without a finish chunk"
    result.tbt = summarize_gaps(result.tbt_gaps_s)


def _on_error_response(
    result: RequestResult, status: int, body: bytes, response: aiohttp.ClientResponse
) -> None:
    result.http_status = status
    text = body.decode(errors="replace")
    try:
        detail = json.loads(text).get("error", {})
    except (ValueError, AttributeError):
        detail = {}
    if not isinstance(detail, dict):
        detail = {}
    # A rejection: 429 (overload), or 503 when no prefill or decode instance serves.
    if status in (429, 503) and "reason" in detail and "stage" in detail:
        _on_error_detail(result, detail, retry_after=response.headers.get("Retry-After"))
        return
    result.status = "http_error"
    result.message = detail.get("message") or text[:200]


def _on_error_detail(result: RequestResult, detail: dict, retry_after: str | None) -> None:
    result.id = detail.get("request_id", result.id)
    if "reason" in detail:
        result.status = "rejected"
        result.reason = detail["reason"]
        result.stage = detail.get("stage")
        retry_after_s = detail.get("retry_after_s")
        if retry_after_s is None and retry_after is not None:
            retry_after_s = float(retry_after)
        result.retry_after_s = retry_after_s
        result.message = detail.get("message")
    else:
        result.status = "failed"
        result.message = detail.get("message", "the request failed")
