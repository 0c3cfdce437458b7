"""Each prefill instance's line of dispatched requests, as the Conductor sees it.

An agent works on its prefills one at a time, in the order they were dispatched to it. The
Conductor does not see an agent take a prefill up; it sees a prefill end when the agent's
answer comes back. So, for the instance's queue (`cluster.PrefillState`), a request starts
(`PrefillStarted`) when it is dispatched to an empty line, or when the answer of the one
ahead of it comes back. The live runtime and the twin keep their lines with this class, so
the core's queue of an instance moves at the same moments in both.
"""

from collections import deque
from collections.abc import Callable


class PrefillLines:
    """The requests dispatched to each prefill instance and not yet answered, in order."""

    def __init__(self) -> None:
        self._lines: dict[str, deque[str]] = {}

    def join(self, instance_id: str, request_id: str) -> bool:
        """Queue a dispatched request; True when it is first in line (it starts now)."""
        line = self._lines.setdefault(instance_id, deque())
        line.append(request_id)
        return len(line) == 1

    def leave(
        self, instance_id: str, request_id: str, is_waiting: Callable[[str], bool]
    ) -> str | None:
        """The request's prefill ended (answered, failed or moved): the request that starts
        now, if it was first in line; those no longer waiting there (`is_waiting` False:
        ended or moved meanwhile) leave the line on the way."""
        line = self._lines.get(instance_id)
        if not line or request_id not in line:
            return None
        was_first = line[0] == request_id
        line.remove(request_id)
        while was_first and line:
            if is_waiting(line[0]):
                return line[0]
            line.popleft()
        return None

    def forget(self, instance_id: str) -> None:
        """The instance left: its line goes with it."""
        self._lines.pop(instance_id, None)
