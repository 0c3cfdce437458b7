"""How the agents' shared secret travels with every gRPC call (one metadata entry), and the
server interceptor that checks it (the Agent and the Conductor service use the same)."""

import hmac
from collections.abc import Callable
from typing import Any

import grpc

SECRET_METADATA_KEY = "kvcentric-secret"


def call_metadata(secret: str) -> tuple[tuple[str, str], ...]:
    """The metadata to pass as `metadata=` on every call to an agent."""
    return ((SECRET_METADATA_KEY, secret),)


def holds_secret(metadata: object, secret: str) -> bool:
    """Whether gRPC invocation metadata (pairs of key, value) carries `secret`."""
    for key, value in metadata or ():  # type: ignore[attr-defined]
        if key == SECRET_METADATA_KEY and isinstance(value, str):
            return hmac.compare_digest(value.encode(), secret.encode())
    return False


class SecretInterceptor(grpc.ServerInterceptor):
    """Refuses every call whose metadata lacks the shared secret (UNAUTHENTICATED)."""

    def __init__(self, secret: str) -> None:
        self._secret = secret

    def intercept_service(self, continuation: Callable[..., Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None or holds_secret(details.invocation_metadata, self._secret):
            return handler
        message = f"missing or wrong shared secret (gRPC metadata {SECRET_METADATA_KEY!r})"

        def deny(request: object, context: grpc.ServicerContext) -> None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

        make = (
            grpc.unary_stream_rpc_method_handler
            if handler.response_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        return make(
            deny,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
