"""Who may call the REST API: FastAPI dependencies that check an API key (submission and
reads) or the admin token (configuration changes) and yield the caller's `Principal`.

Credentials travel as `Authorization: Bearer <secret>` or `x-api-key: <secret>`. Secrets are
compared as SHA-256 digests with `hmac.compare_digest` against every configured secret, so
neither a secret's length nor which key matched shows in the response time.
"""

import hashlib
import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from backend.settings import ConductorSettings
from backend.settings.conductor import ADMIN_NAME

REALM = "kvcentric"
API_KEY_HEADER = "x-api-key"


@dataclass(frozen=True, slots=True)
class Principal:
    """The authenticated caller, as the audit log names it."""

    name: str
    is_admin: bool


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


class Authenticator:
    """The configured secrets (as digests) and who each one is."""

    def __init__(self, *, api_keys: dict[str, str], admin_token: str | None) -> None:
        """`api_keys` maps each key's name to the key; no admin token: nobody is admin."""
        self._keys = [(_digest(key), name) for name, key in api_keys.items()]
        self._admin = _digest(admin_token) if admin_token is not None else None

    @classmethod
    def from_settings(cls, settings: ConductorSettings) -> "Authenticator":
        return cls(
            api_keys={entry.name: entry.key.get_secret_value() for entry in settings.api_keys},
            admin_token=(settings.admin_token.get_secret_value() if settings.admin_token else None),
        )

    def identify(self, secret: str) -> Principal | None:
        """The principal `secret` belongs to, or None; compares against every secret."""
        digest = _digest(secret)
        found: Principal | None = None
        if self._admin is not None and hmac.compare_digest(digest, self._admin):
            found = Principal(name=ADMIN_NAME, is_admin=True)
        for key, name in self._keys:  # no early exit: the time does not tell which matched
            if hmac.compare_digest(digest, key) and found is None:
                found = Principal(name=name, is_admin=False)
        return found


async def get_authenticator(request: Request) -> Authenticator:
    """The app's Authenticator, set by `create_app`."""
    return request.app.state.authenticator


# The dependencies are `async def` though they never await: FastAPI runs plain `def` ones in
# its thread pool, a round trip that cost more than the checks themselves.

# Declared as security schemes so the OpenAPI document shows both ways to authenticate.
_bearer = HTTPBearer(auto_error=False, description="An API key or the admin token.")
_api_key = APIKeyHeader(
    name=API_KEY_HEADER, auto_error=False, description="An API key or the admin token."
)


def _unauthorized(message: str, code: str, error: str | None = None) -> HTTPException:
    challenge = f'Bearer realm="{REALM}"' + (f', error="{error}"' if error else "")
    return HTTPException(
        status_code=status.HTTP_401_UNAUTHORIZED,
        detail={"message": message, "code": code},
        headers={"WWW-Authenticate": challenge},
    )


async def authenticate(
    request: Request,
    authenticator: Annotated[Authenticator, Depends(get_authenticator)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    api_key: Annotated[str | None, Depends(_api_key)],
) -> Principal:
    """Whoever the request's credentials name (an API key holder or the admin), else 401."""
    authorization = request.headers.get("authorization")
    if authorization is not None and bearer is None:
        raise _unauthorized(
            "the Authorization header must be 'Bearer <secret>'",
            "malformed_credentials",
            "invalid_request",
        )
    secret = bearer.credentials if bearer is not None else api_key
    if not secret:
        raise _unauthorized(
            f"missing credentials: send 'Authorization: Bearer <key>' or '{API_KEY_HEADER}: <key>'",
            "missing_credentials",
        )
    if bearer is not None and api_key is not None and api_key != bearer.credentials:
        raise _unauthorized(
            f"the Authorization and {API_KEY_HEADER} headers carry different secrets",
            "conflicting_credentials",
            "invalid_request",
        )
    principal = authenticator.identify(secret)
    if principal is None:
        raise _unauthorized("invalid credentials", "invalid_credentials", "invalid_token")
    return principal


async def require_api_key(principal: Annotated[Principal, Depends(authenticate)]) -> Principal:
    """Submission and read endpoints: any API key; the admin token is accepted too."""
    return principal


async def require_admin(principal: Annotated[Principal, Depends(authenticate)]) -> Principal:
    """Configuration changes: the admin token only; an API key gets 403."""
    if not principal.is_admin:
        raise HTTPException(
            status_code=status.HTTP_403_FORBIDDEN,
            detail={
                "message": (
                    f"API key {principal.name!r} may not change configuration: "
                    "this needs the admin token"
                ),
                "code": "admin_required",
            },
            headers={"WWW-Authenticate": f'Bearer realm="{REALM}", error="insufficient_scope"'},
        )
    return principal


ApiKey = Annotated[Principal, Depends(require_api_key)]
AdminToken = Annotated[Principal, Depends(require_admin)]
