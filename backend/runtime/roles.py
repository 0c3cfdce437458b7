"""Switching a live agent between prefill and decode: drain first, then switch.

The core stops giving the instance new work at once (AgentDraining). The switch then waits
until the requests it already has are done, in the core's books and on the agent (Drain),
tells the agent its new role (SetRole) and rejoins it in the core under that role. When
anything fails on the way, the instance goes back to work in its old role.
"""

import time
from collections.abc import Callable


class RoleSwitchRefused(Exception):
    """The switch cannot be done now; `str(error)` says why (an API answers 409)."""


def wait_until_idle(
    count_work: Callable[[], int], *, timeout_s: float, poll_s: float = 0.05
) -> None:
    """Wait until `count_work()` is 0; RoleSwitchRefused after `timeout_s`."""
    deadline_s = time.monotonic() + timeout_s
    while (remaining := count_work()) > 0:
        if time.monotonic() >= deadline_s:
            raise RoleSwitchRefused(
                f"still {remaining} request(s) in flight after draining for {timeout_s:g} s"
            )
        time.sleep(poll_s)
