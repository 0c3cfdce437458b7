"""The replay loop: each planned request sent at its time, results written as they end.

Every planned request is sent once and yields exactly one result line, whatever happens to
it; a concurrency limit delays sends (recorded in `sent_s`) rather than dropping them.
"""

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

import aiohttp
import httpx

from backend.loadgen.client import send_request
from backend.loadgen.plan import PlannedRequest
from backend.loadgen.results import RequestResult

_CONNECT_TIMEOUT_S = 5.0
_WAIT_POLL_S = 0.5


class PreflightError(Exception):
    """The server cannot be replayed against (unreachable, or the key is refused); one line."""


@dataclass(frozen=True, slots=True)
class ReplayRun:
    results: list[RequestResult]
    duration_s: float


def check_server(
    base_url: str,
    api_key: str,
    *,
    wait_s: float = 0.0,
    on_wait: Callable[[str], None] | None = None,
) -> None:
    """Raise PreflightError unless GET /healthz answers, the key lists the models and a
    prefill and a decode agent have joined; waits up to `wait_s` for the Conductor and its
    agents (a stack being started), telling `on_wait` once what it waits for."""
    deadline_s = time.monotonic() + wait_s
    told = ""
    while True:
        try:
            _check_once(base_url, api_key)
            return
        except PreflightError as error:
            waitable = isinstance(error, _NotYet)
            if not waitable or time.monotonic() >= deadline_s:
                raise PreflightError(str(error)) from None
            if on_wait is not None and str(error) != told:
                told = str(error)
                on_wait(f"{told}; waiting up to {wait_s:g} s")
            time.sleep(_WAIT_POLL_S)


class _NotYet(PreflightError):
    """What a starting stack has not done yet (answer, have agents): worth waiting for."""


def _check_once(base_url: str, api_key: str) -> None:
    headers = {"Authorization": f"Bearer {api_key}"}
    try:
        with httpx.Client(base_url=base_url, timeout=_CONNECT_TIMEOUT_S) as client:
            health = client.get("/healthz")
            if health.status_code != 200:
                raise _NotYet(f"{base_url}/healthz answered HTTP {health.status_code}")
            models = client.get("/v1/models", headers=headers)
            agents = client.get("/v1/agents", headers=headers) if models.is_success else None
    except httpx.HTTPError as error:
        raise _NotYet(f"cannot reach {base_url}: {error or type(error).__name__}") from None
    if models.status_code == 401:
        raise PreflightError(f"{base_url} refused the API key (HTTP 401); check --api-key")
    if models.status_code != 200 or agents is None or agents.status_code != 200:
        status = models.status_code if models.status_code != 200 else agents.status_code
        raise PreflightError(f"{base_url} answered HTTP {status} to the preflight")
    roles = {a.get("role") for a in agents.json() if a.get("state", "active") == "active"}
    missing = [role for role in ("prefill", "decode") if role not in roles]
    if missing:
        raise _NotYet(
            f"{base_url} has no {' and no '.join(missing)} agent yet (start one with "
            f"`kvcentric agent --role {missing[0]} --conductor HOST:PORT ...`)"
        )


async def replay(
    base_url: str,
    api_key: str,
    planned: Sequence[PlannedRequest],
    out: TextIO,
    *,
    concurrency_limit: int | None = None,
    on_result: Callable[[RequestResult], None] | None = None,
) -> ReplayRun:
    """Send `planned` against `base_url`, writing one JSON line per result to `out`."""
    # The whole URL with each request (aiohttp's own base URL would drop a path's prefix),
    # so without its trailing slash.
    base_url = base_url.rstrip("/")
    limit = concurrency_limit if concurrency_limit is not None else len(planned) or 1
    slots = asyncio.Semaphore(limit)
    results: list[RequestResult] = []
    start = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=None, connect=_CONNECT_TIMEOUT_S)
    headers = {"Authorization": f"Bearer {api_key}"}

    async def one(request: PlannedRequest) -> None:
        await asyncio.sleep(max(0.0, request.send_at_s - (time.monotonic() - start)))
        async with slots:
            sent_s = time.monotonic() - start
            try:
                result = await send_request(client, request, sent_s=sent_s, base_url=base_url)
            except Exception as error:  # a bad stream must still leave its line
                result = RequestResult(
                    line=request.line_number, sent_s=sent_s, status="failed", message=repr(error)
                )
        results.append(result)
        out.write(json.dumps(result.to_record()) + "\n")
        out.flush()
        if on_result is not None:
            on_result(result)

    # As many connections as requests in flight (the concurrency limit bounds them); each is
    # kept for the next request.
    connector = aiohttp.TCPConnector(limit=0 if concurrency_limit is None else limit)
    async with aiohttp.ClientSession(
        headers=headers, timeout=timeout, connector=connector
    ) as client:
        await asyncio.gather(*(one(request) for request in planned))
    return ReplayRun(results=results, duration_s=time.monotonic() - start)
