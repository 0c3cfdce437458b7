"""How the agents' shared secret travels with every gRPC call: one metadata entry."""

import hmac

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
