"""ConsoleSettings: where the console's defaults come from (KVC_CONSOLE_* environment, which
`kvcentric console` sets from its options), so secrets never travel on a command line."""

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

# "live": the profile the Conductor fits from what its agents measured (GET /v1/calibration);
# else a built-in ("tiny-cpu": the `tiny` agents measured on an idle machine) or a file.
LIVE_TWIN_PROFILE = "live"
DEFAULT_TWIN_PROFILE = LIVE_TWIN_PROFILE
DEFAULT_BACKEND_URL = "http://127.0.0.1:8000"
DEFAULT_REFRESH_S = 2.0

ENV_BACKEND = "KVC_CONSOLE_BACKEND"
ENV_API_KEY = "KVC_CONSOLE_API_KEY"
ENV_TWIN_PROFILE = "KVC_CONSOLE_TWIN_PROFILE"
ENV_REFRESH_S = "KVC_CONSOLE_REFRESH_S"
ENV_RAY_ADDRESS = "KVC_CONSOLE_RAY_ADDRESS"


@dataclass(frozen=True, slots=True)
class ConsoleSettings:
    """The backend's URL, the API key for reads (held by the console's server process; the
    admin token is never given to the console: operators sign in with it), the twin's timing
    profile and how often live pages refresh."""

    backend_url: str = DEFAULT_BACKEND_URL
    api_key: str = field(default="", repr=False)
    twin_profile: str = str(DEFAULT_TWIN_PROFILE)
    refresh_s: float = DEFAULT_REFRESH_S
    ray_address: str | None = None  # what-if runs as Ray tasks there (twin/ray_sweep.py)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "ConsoleSettings":
        """From KVC_CONSOLE_* variables; a missing or empty one keeps the default."""
        env = os.environ if env is None else env
        refresh = env.get(ENV_REFRESH_S) or ""
        try:
            refresh_s = float(refresh) if refresh else DEFAULT_REFRESH_S
        except ValueError:
            refresh_s = DEFAULT_REFRESH_S
        return cls(
            backend_url=env.get(ENV_BACKEND) or DEFAULT_BACKEND_URL,
            api_key=env.get(ENV_API_KEY) or "",
            twin_profile=env.get(ENV_TWIN_PROFILE) or str(DEFAULT_TWIN_PROFILE),
            refresh_s=refresh_s if refresh_s > 0 else DEFAULT_REFRESH_S,
            ray_address=env.get(ENV_RAY_ADDRESS) or None,
        )

    def to_env(self) -> dict[str, str]:
        """The variables that make `from_env` return these settings."""
        return {
            ENV_BACKEND: self.backend_url,
            ENV_API_KEY: self.api_key,
            ENV_TWIN_PROFILE: self.twin_profile,
            ENV_REFRESH_S: str(self.refresh_s),
            ENV_RAY_ADDRESS: self.ray_address or "",
        }
