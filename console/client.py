"""BackendClient: the console's only way to the Conductor (its REST API), and BackendError,
which turns every failure (unreachable, 401, 403, 429, other 4xx/5xx) into one readable
sentence the pages show with `st.error` instead of a traceback.

The Conductor's error bodies have the OpenAI shape `{"error": {"message", "type", "code"}}`
(backend/api/app.py); anything else is shown by status and a short excerpt of the body.
"""

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from console.prediction import json_safe

READ_TIMEOUT_S = 10.0
EXPORT_TIMEOUT_S = 60.0
# Role switches drain the agent first: the call lasts up to the drain timeout.
ROLE_SWITCH_SLACK_S = 15.0
_MAX_BODY_EXCERPT_CHARS = 200

CONFIG_PATH = "/v1/config"
AUDIT_PATH = "/v1/audit"
ROLE_PATH = "/v1/admin/agents/{instance_id}/role"


class BackendError(Exception):
    """A request to the backend failed; str() is a message fit for an operator."""

    def __init__(self, message: str, *, status_code: int | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.code = code


@dataclass(frozen=True, slots=True)
class BackendClient:
    """Calls one backend with an API key (reads) and, for changes, the admin token."""

    base_url: str
    api_key: str = field(default="", repr=False)  # secrets stay out of logs and reprs
    admin_token: str = field(default="", repr=False)

    # -- reads (API key) -------------------------------------------------------------------
    def agents(self) -> list[dict[str, Any]]:
        return self._read("/v1/agents")

    def report(
        self,
        *,
        window_s: float | None = None,
        start_s: float | None = None,
        end_s: float | None = None,
        interval_s: float | None = None,
    ) -> dict[str, Any]:
        """The live metrics of a window, in the twin report's names (GET /v1/report)."""
        params = {
            "window_s": window_s,
            "start_s": start_s,
            "end_s": end_s,
            "interval_s": interval_s,
        }
        return self._read("/v1/report", params)

    def cache(self, *, limit: int = 20) -> dict[str, Any]:
        return self._read("/v1/cache", {"limit": limit})

    def config(self) -> dict[str, Any]:
        """{"version": int | None, "config": {...}}: the policy configuration in force."""
        return self._read(CONFIG_PATH)

    def calibration(self, *, inputs: bool = False) -> dict[str, Any]:
        """Believed vs measured times, and the live cluster as a twin profile; with
        `inputs`, also what the calibration kept (its window's state, what it believed
        from when, its settings: `profile_inputs`)."""
        params: dict[str, Any] = {"max_points": 500}
        if inputs:
            params["inputs"] = "true"
        return self._read("/v1/calibration", params)

    def audit(self, *, limit: int = 100) -> list[dict[str, Any]]:
        return self._read(AUDIT_PATH, {"limit": limit})

    def export_trace(self, *, start_s: float, end_s: float, block_size: int | None = None) -> str:
        """The requests that arrived in [start_s, end_s) as Mooncake JSONL text, with hash ids
        of `block_size` tokens (None: the public traces' 512)."""
        response = self._send(
            "GET",
            "/v1/export/trace",
            secret=self.api_key,
            params={"start_s": start_s, "end_s": end_s, "block_size": block_size},
            timeout_s=EXPORT_TIMEOUT_S,
        )
        return response.text

    # -- changes (admin token) -------------------------------------------------------------
    def change_config(
        self,
        config: Mapping[str, Any],
        *,
        prediction: Mapping[str, Any] | None = None,
        expected_version: int | None = None,
    ) -> dict[str, Any]:
        body = {
            "config": dict(config),
            "prediction": dict(prediction) if prediction is not None else None,
            "expected_version": expected_version,
        }
        return self._call("PUT", CONFIG_PATH, secret=self._admin(), body=body)

    def check_admin(self) -> None:
        """Whether the admin token is the Conductor's: a change that changes nothing, which
        the backend answers without saving a version or an audit entry; BackendError if not."""
        self._call("PUT", CONFIG_PATH, secret=self._admin(), body={"config": {}})

    def switch_role(
        self, instance_id: str, role: str, *, drain_timeout_s: float = 30.0
    ) -> dict[str, Any]:
        """Drain the agent, then switch its role (audited by the backend)."""
        return self._call(
            "POST",
            ROLE_PATH.format(instance_id=instance_id),
            secret=self._admin(),
            body={"role": role, "drain_timeout_s": drain_timeout_s},
            timeout_s=drain_timeout_s + ROLE_SWITCH_SLACK_S,
        )

    # -- plumbing --------------------------------------------------------------------------
    def _admin(self) -> str:
        if not self.admin_token:
            raise BackendError(
                "this change needs the admin token: sign in with it in the sidebar",
                code="no_admin_token",
            )
        return self.admin_token

    def _read(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        return self._call("GET", path, secret=self.api_key, params=params)

    def _call(
        self,
        method: str,
        path: str,
        *,
        secret: str,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        timeout_s: float = READ_TIMEOUT_S,
    ) -> Any:
        response = self._send(
            method, path, secret=secret, params=params, body=body, timeout_s=timeout_s
        )
        try:
            return response.json()
        except ValueError:
            raise BackendError(
                f"{method} {path}: the backend answered {response.status_code} with a body that "
                f"is not JSON: {_excerpt(response.text)}",
                status_code=response.status_code,
            ) from None

    def _send(
        self,
        method: str,
        path: str,
        *,
        secret: str,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        timeout_s: float = READ_TIMEOUT_S,
    ) -> httpx.Response:
        if not secret:
            raise BackendError(
                "no API key: sign in with one in the sidebar (`kvcentric up` prints it at "
                "start as KVC_API_KEY and keeps it in data/secrets.env)",
                code="no_api_key",
            )
        url = self.base_url.rstrip("/") + path
        headers = {"Authorization": f"Bearer {secret}"}
        content = None
        if body is not None:
            # Strict JSON: the backend reads an infinite number sent as the string "inf".
            content = json.dumps(json_safe(body), allow_nan=False).encode()
            headers["Content-Type"] = "application/json"
        kept = {name: value for name, value in (params or {}).items() if value is not None}
        try:
            response = httpx.request(
                method, url, params=kept, content=content, headers=headers, timeout=timeout_s
            )
        except httpx.TimeoutException:
            raise BackendError(
                f"the backend at {self.base_url} did not answer {method} {path} "
                f"within {timeout_s:.0f} s",
                code="timeout",
            ) from None
        except httpx.InvalidURL as error:
            raise BackendError(f"invalid backend URL {self.base_url!r}: {error}") from None
        except httpx.HTTPError as error:
            raise BackendError(
                f"cannot reach the backend at {self.base_url} ({_reason(error)}); "
                "is `kvcentric conductor` running there?",
                code="unreachable",
            ) from None
        if response.is_success:
            return response
        raise error_from_response(method, path, response)


def error_from_response(method: str, path: str, response: httpx.Response) -> BackendError:
    """The readable error of a non-2xx answer, by status."""
    status = response.status_code
    message, code = _error_message(response)
    if status == 401:
        text = f"the backend refused the credentials (401 unauthorized): {message}"
        text += ". Check the console's --api-key or the key you signed in with."
    elif status == 403:
        text = f"not allowed (403 forbidden): {message}"
    elif status == 429:
        retry = response.headers.get("Retry-After")
        text = f"the backend is rejecting requests (429 too many requests): {message}"
        if retry:
            text += f"; retry after {retry} s"
    elif status == 404:
        text = f"{method} {path}: not found (404): {message}"
    else:
        text = f"{method} {path} failed ({status}): {message}"
    return BackendError(text, status_code=status, code=code)


def _error_message(response: httpx.Response) -> tuple[str, str | None]:
    try:
        body = response.json()
    except ValueError:
        return _excerpt(response.text) or response.reason_phrase, None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"]), error.get("code")
    if isinstance(body, dict) and "detail" in body:  # a plain FastAPI error
        return str(body["detail"]), None
    return _excerpt(response.text), None


def _excerpt(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > _MAX_BODY_EXCERPT_CHARS:
        return text[:_MAX_BODY_EXCERPT_CHARS] + "..."
    return text


def _reason(error: httpx.HTTPError) -> str:
    if isinstance(error, httpx.ConnectError):
        return "connection refused" if "refused" in str(error).lower() else str(error) or "no route"
    return f"{type(error).__name__}: {error}"
