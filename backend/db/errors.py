"""Errors the persistence functions raise, each with a message naming what went wrong."""


class PersistenceError(Exception):
    """Base of the errors below."""


class RequestNotFound(PersistenceError, LookupError):
    def __init__(self, request_id: str) -> None:
        super().__init__(f"no request {request_id!r} was recorded")
        self.request_id = request_id


class OutcomeAlreadyRecorded(PersistenceError):
    """A request already has its terminal state; each request ends exactly once."""

    def __init__(self, request_id: str, recorded: str, attempted: str) -> None:
        super().__init__(
            f"request {request_id!r} already ended as {recorded!r}; refusing a second "
            f"terminal state {attempted!r} (every request ends exactly once)"
        )
        self.request_id = request_id
        self.recorded = recorded
        self.attempted = attempted


class AgentNotFound(PersistenceError, LookupError):
    def __init__(self, instance_id: str) -> None:
        super().__init__(f"no agent {instance_id!r} was recorded")
        self.instance_id = instance_id


class ConfigVersionConflict(PersistenceError):
    """Someone saved a configuration version since the caller read the current one."""

    def __init__(self, expected: int | None, current: int | None) -> None:
        super().__init__(
            f"configuration changed concurrently: expected current version {expected}, "
            f"found {current}; read it again and retry"
        )
        self.expected = expected
        self.current = current
