"""create_app: the Conductor's FastAPI app with its open health and metrics endpoints, the
request body limit and the error handlers that make every error a JSON body with a message
(405s with every method the path serves in Allow), and an OpenAPI document that also lists
the 401 of every operation needing credentials.

Errors use the OpenAI shape, which OpenAI clients understand:
`{"error": {"message": ..., "type": ..., "code": ...}}`. Raise `HTTPException` with `detail`
either a message or `{"message": ..., "code": ...}`; headers (WWW-Authenticate,
Retry-After) pass through. Tracebacks are logged, never sent.
"""

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backend.api.access_log import AccessLog
from backend.api.auth import Authenticator
from backend.api.routes import include_routes
from backend.api.schemas.convert import ApiLimits
from backend.api.schemas.errors import ErrorBody
from backend.metrics import ConductorMetrics
from backend.runtime import ConductorRuntime
from backend.settings import ConductorSettings

logger = logging.getLogger(__name__)

# A readiness check answers whether one dependency (database, agents, ...) is ready.
ReadinessCheck = Callable[[], Awaitable[bool]]

_MAX_FIELD_ERRORS_IN_MESSAGE = 3
_HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def create_app(
    settings: ConductorSettings,
    *,
    readiness_checks: Mapping[str, ReadinessCheck] | None = None,
    metrics: ConductorMetrics | None = None,
    metrics_path: str | None = "/metrics",
    runtime: ConductorRuntime | None = None,
    limits: ApiLimits | None = None,
) -> FastAPI:
    """The app, with /healthz, /readyz and `metrics_path` (None: no metrics route); with a
    `runtime`, also the serving routes (`backend.api.routes`), served within `limits`."""
    app = FastAPI(
        title="kvcentric Conductor",
        summary="KVCache-centric, prefill/decode-disaggregated LLM serving (after Mooncake)",
        version="0.1.0",
        docs_url=None,  # served below from the package: no CDN, so /docs works offline
    )
    _serve_docs_offline(app)
    app.state.settings = settings
    app.state.authenticator = Authenticator.from_settings(settings)
    app.state.readiness_checks = dict(readiness_checks or {})
    app.state.metrics = metrics or ConductorMetrics(
        block_size=settings.block_size, scheduler=settings.prefill_scheduler
    )
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_request_body_bytes)
    if settings.access_log:  # outermost: its line covers the 413s and errors of the rest
        app.add_middleware(AccessLog)
    app.add_exception_handler(HTTPException, _on_http_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(Exception, _on_unexpected_error)

    @app.get("/healthz", tags=["health"], summary="Liveness: the process answers")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], summary="Readiness: every readiness check passes")
    async def readyz(request: Request) -> JSONResponse:
        results = {
            name: await _run_check(name, check)
            for name, check in request.app.state.readiness_checks.items()
        }
        failing = [name for name, result in results.items() if result != "ok"]
        if not failing:
            return JSONResponse({"status": "ready", "checks": results})
        body = error_body(503, f"not ready: {', '.join(failing)}", code="not_ready")
        return JSONResponse({**body, "status": "not ready", "checks": results}, status_code=503)

    if metrics_path is not None:  # open like the health endpoints: scrapers carry no key

        @app.get(
            metrics_path,
            tags=["health"],
            summary="Prometheus metrics (text format)",
            response_class=PlainTextResponse,
        )
        async def prometheus_metrics(request: Request) -> PlainTextResponse:
            collected: ConductorMetrics = request.app.state.metrics
            return PlainTextResponse(collected.render(), media_type=collected.content_type)

    if runtime is not None:
        runtime.attach_metrics(app.state.metrics)
        include_routes(app, runtime, limits=limits)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _serve_docs_offline(app: FastAPI) -> None:
    """Swagger UI at /docs from the swagger-ui-bundle package's files, not a CDN (FastAPI's
    default page is blank on a machine without internet)."""
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.staticfiles import StaticFiles
    from swagger_ui_bundle import swagger_ui_path

    app.mount("/docs-assets", StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title}: API docs",
            swagger_js_url="/docs-assets/swagger-ui-bundle.js",
            swagger_css_url="/docs-assets/swagger-ui.css",
            swagger_favicon_url="/docs-assets/favicon-32x32.png",
        )


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's OpenAPI document, plus the 401 that every operation needing credentials
    answers without them (the auth dependency raises it; FastAPI cannot know)."""
    if app.openapi_schema is None:
        document = FastAPI.openapi(app)  # sets app.openapi_schema
        operations = [
            operation
            for path_item in document.get("paths", {}).values()
            for operation in path_item.values()
            if isinstance(operation, dict) and operation.get("security")
        ]
        if operations:
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            if "ErrorBody" not in schemas:
                body = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
                schemas.update(body.pop("$defs", {}))
                schemas["ErrorBody"] = body
        for operation in operations:
            operation.setdefault("responses", {}).setdefault(
                "401",
                {
                    "description": "Missing or invalid credentials",
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}
                    },
                },
            )
    return app.openapi_schema


async def _run_check(name: str, check: ReadinessCheck) -> str:
    try:
        return "ok" if await check() else "failing"
    except Exception as error:  # a broken check means not ready, never a 500
        logger.exception("readiness check %r raised", name)
        return f"failing ({type(error).__name__})"


def error_body(
    status_code: int, message: str, *, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """The JSON body of every error response (backend.api.schemas.errors.ErrorBody's shape)."""
    if status_code == 401:
        kind = "authentication_error"
    elif status_code == 403:
        kind = "permission_error"
    elif status_code == 429:
        kind = "rate_limit_error"
    elif status_code >= 500:
        kind = "server_error"
    else:
        kind = "invalid_request_error"
    return {"error": {"message": message, "type": kind, "code": code, "param": param}}


async def _on_http_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, HTTPException)
    detail = error.detail
    if isinstance(detail, Mapping) and "message" in detail:
        message, code = str(detail["message"]), detail.get("code")
    else:
        message, code = str(detail), None
    headers = error.headers
    if error.status_code == 405 and (allowed := _allowed_methods(request)):
        headers = {**(headers or {}), "Allow": allowed}  # Starlette's names one route's only
    return JSONResponse(
        error_body(error.status_code, message, code=code),
        status_code=error.status_code,
        headers=headers,
    )


def _allowed_methods(request: Request) -> str:
    """Every method that some route serves at the request's path, as RFC 9110's Allow lists
    them (GET /v1/config and PUT /v1/config are two routes)."""
    routes = request.app.router.routes
    return ", ".join(
        method
        for method in _HTTP_METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes
        )
    )


async def _on_validation_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    fields = [_field_error(details) for details in error.errors()]
    summary = "; ".join(
        f"{f['field']}: {f['message']}" for f in fields[:_MAX_FIELD_ERRORS_IN_MESSAGE]
    )
    if len(fields) > _MAX_FIELD_ERRORS_IN_MESSAGE:
        summary += f"; and {len(fields) - _MAX_FIELD_ERRORS_IN_MESSAGE} more"
    param = fields[0]["field"].removeprefix("body.") if fields else None
    if any(details.get("type") == "json_invalid" for details in error.errors()):
        # Not JSON at all: 400, as OpenAI answers (422 is for JSON whose fields are wrong).
        body = error_body(400, f"invalid request: {summary}", code="invalid_json")
        return JSONResponse(body, status_code=400)
    body = error_body(422, f"invalid request: {summary}", code="validation_error", param=param)
    body["error"]["fields"] = fields
    return JSONResponse(body, status_code=422)


def _field_error(details: Mapping[str, Any]) -> dict[str, str]:
    """One field's problem, without the input (it may be large or secret)."""
    loc = [str(part) for part in details.get("loc", ())]
    if details.get("type") == "json_invalid":
        reason = details.get("ctx", {}).get("error", "")
        return {
            "field": "body",
            "message": f"malformed JSON ({reason})" if reason else "malformed JSON",
        }
    return {"field": ".".join(loc) or "request", "message": str(details.get("msg", "invalid"))}


async def _on_unexpected_error(request: Request, error: Exception) -> JSONResponse:
    logger.error("unhandled error on %s %s", request.method, request.url.path, exc_info=error)
    return JSONResponse(
        error_body(500, "internal server error", code="internal_error"), status_code=500
    )


class BodyTooLarge(HTTPException):
    """A request body over the limit: 413, raised while the body is read."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(
            status_code=413,
            detail={
                "message": f"request body over the limit of {max_bytes} bytes",
                "code": "body_too_large",
            },
        )


class BodySizeLimit:
    """ASGI middleware refusing bodies over `max_bytes`: at once when Content-Length says so,
    else as soon as the bytes read pass the limit (chunked bodies)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and (declared < 0 or declared > self.max_bytes):
            status_code = 413 if declared > self.max_bytes else 400
            message = (
                f"request body over the limit of {self.max_bytes} bytes"
                if status_code == 413
                else "invalid Content-Length header"
            )
            code = "body_too_large" if status_code == 413 else "invalid_content_length"
            response = JSONResponse(error_body(status_code, message, code=code), status_code)
            await response(scope, receive, send)
            return
        num_received = 0

        async def receive_within_limit() -> Message:
            nonlocal num_received
            message = await receive()
            if message["type"] == "http.request":
                num_received += len(message.get("body", b""))
                if num_received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, receive_within_limit, send)


def _content_length(scope: Scope) -> int | None:
    """The declared body length; -1 when the header is not a number."""
    for key, value in scope.get("headers", ()):
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return -1
    return None


__all__ = ["BodySizeLimit", "ReadinessCheck", "create_app", "error_body"]
