"""One access line per HTTP request: method, path, status, latency, client and request id.

`AccessLog` is ASGI middleware logging to the `kvcentric.access` logger (INFO) once the
response's last byte is sent, so a streamed completion's latency covers its whole stream. A
serving route names the request it created with `note_request_id`; other requests show the
client's `X-Request-Id` or `-`. Turned off with `access_log = false` (`KVC_ACCESS_LOG=0`).
"""

import logging
import time
from contextvars import ContextVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger("kvcentric.access")

# The current HTTP request's notes; a dict, so a note made in a copied context still lands.
_notes: ContextVar[dict[str, str] | None] = ContextVar("kvcentric_access_notes", default=None)


def note_request_id(request_id: str) -> None:
    """Name the serving request this HTTP request created (shown in its access line)."""
    notes = _notes.get()
    if notes is not None:
        notes["request_id"] = request_id


class AccessLog:
    """ASGI middleware writing one `kvcentric.access` line per HTTP request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not logger.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        started_s = time.perf_counter()
        notes: dict[str, str] = {}
        token = _notes.set(notes)
        status = 0
        logged = False

        def log_line() -> None:
            nonlocal logged
            if logged:
                return
            logged = True
            client = scope.get("client")
            query = scope.get("query_string", b"").decode("latin-1")
            path = scope.get("path", "") + (f"?{query}" if query else "")
            logger.info(
                "%s %s %d %.1f ms client=%s request_id=%s",
                scope.get("method", "-"),
                path,
                status,
                (time.perf_counter() - started_s) * 1000.0,
                f"{client[0]}:{client[1]}" if client else "-",
                notes.get("request_id") or _header(scope, b"x-request-id") or "-",
            )

        async def send_and_log(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                log_line()

        try:
            await self.app(scope, receive, send_and_log)
        finally:
            log_line()  # a client gone mid-stream, or an error before the body: still one line
            _notes.reset(token)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")[:128]
    return None
