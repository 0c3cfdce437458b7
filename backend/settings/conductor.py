"""ConductorSettings: everything the Conductor process is told at start, validated as a whole.

Sources, highest precedence first: keyword arguments (the command line's flags), `KVC_*`
environment variables (`KVC_PORT`, `KVC_API_KEYS`, ...), the TOML file named by
`config_file` (`--config` or `KVC_CONFIG_FILE`), then the defaults below. No `.env` file and
no secrets directory are read. Secrets are `SecretStr`, so they never show in a repr or log.
"""

import hashlib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from backend.policy.calibration import CalibrationConfig
from backend.policy.config import (
    EvictionPolicy,
    PolicyConfig,
    PrefillScheduler,
    RejectionPolicy,
)
from backend.settings.config_file import ConfigFileSource

ENV_PREFIX = "KVC_"
MIN_SECRET_CHARS = 16
DATABASE_FILE_NAME = "kvcentric.db"
# The Conductor names the admin principal so in the audit log; API keys may not take it.
ADMIN_NAME = "admin"

_POLICY_DEFAULTS = PolicyConfig()
_KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
_DATABASE_SCHEMES = ("sqlite", "postgresql")

Port = Annotated[int, Field(ge=1, le=65535)]
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Secret = Annotated[SecretStr, Field(min_length=MIN_SECRET_CHARS)]


class ApiKeyEntry(BaseModel):
    """One client API key and the name it is recorded under (`name:key` in KVC_API_KEYS)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    key: Secret

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        if not _KEY_NAME.fullmatch(name):
            raise ValueError(
                "must be 1-64 letters, digits, '_', '.', '@' or '-' (starting with a "
                f"letter or digit), got {name!r}"
            )
        if name == ADMIN_NAME:
            raise ValueError(f"{ADMIN_NAME!r} is reserved for the admin token")
        return name


def parse_api_key(text: str) -> dict[str, str]:
    """`name:key` -> its parts; a bare key is named `key-` + the first 8 hex of its SHA-256, a
    stable name that reveals nothing of the key. The first `:` separates name from key."""
    name, separator, key = text.strip().partition(":")
    if not separator:
        key = name
        name = "key-" + hashlib.sha256(key.encode()).hexdigest()[:8]
    return {"name": name.strip(), "key": key.strip()}


class ConductorSettings(BaseSettings):
    """The Conductor's settings; the policy takes only `policy_config()`."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="forbid",
        frozen=True,
        validate_default=True,
        hide_input_in_errors=True,
    )

    config_file: Path | None = None
    # Development only: generate the missing secrets and print them once (see load_settings).
    dev: bool = False

    # Where the REST API listens: loopback unless told otherwise.
    host: str = "127.0.0.1"
    port: Port = 8000
    # Where the gRPC service for agents (join, heartbeats, KV events) listens.
    grpc_host: str = "127.0.0.1"
    grpc_port: Port = 50051
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # One `kvcentric.access` line per HTTP request (method, path, status, latency, client,
    # request id; backend/api/access_log.py). Turn off at hundreds of requests a second,
    # where the lines cost more than the requests: the database records every request anyway.
    access_log: bool = True

    data_dir: Path = Path("data")
    # Empty: a SQLite file `kvcentric.db` under data_dir. Else sqlite:// or postgresql[+driver]://.
    database_url: str = ""

    # Secrets: API keys (submission and reads), the admin token (configuration changes) and
    # the agents' shared secret (joining over gRPC). Required unless `dev` generates them.
    api_keys: Annotated[list[ApiKeyEntry], NoDecode] = Field(default_factory=list)
    admin_token: Secret | None = None
    agent_secret: Secret | None = None

    # The policy's knobs (PolicyConfig), defaulted from PolicyConfig itself.
    block_size: int = Field(default=_POLICY_DEFAULTS.block_size, gt=0)
    prefill_scheduler: PrefillScheduler = _POLICY_DEFAULTS.prefill_scheduler
    kvcache_balancing_threshold: float = Field(
        default=_POLICY_DEFAULTS.kvcache_balancing_threshold, ge=1
    )
    rejection_policy: RejectionPolicy = _POLICY_DEFAULTS.rejection_policy
    eviction_policy: EvictionPolicy = _POLICY_DEFAULTS.eviction_policy
    ttft_slo_s: Seconds = _POLICY_DEFAULTS.ttft_slo_s
    tbt_slo_s: Seconds = _POLICY_DEFAULTS.tbt_slo_s
    decode_time_s: Seconds = _POLICY_DEFAULTS.decode_time_s  # t_d of early-predicted
    learn_decode_time: bool = _POLICY_DEFAULTS.learn_decode_time
    decode_time_window: int = Field(default=_POLICY_DEFAULTS.decode_time_window, gt=0)
    predicted_load_limit: float = Field(
        default=_POLICY_DEFAULTS.predicted_load_limit, gt=0, allow_inf_nan=False
    )
    predicted_size_weight: float = Field(
        default=_POLICY_DEFAULTS.predicted_size_weight, ge=1, allow_inf_nan=False
    )
    seed: int = _POLICY_DEFAULTS.seed
    max_in_flight_requests: int = Field(default=_POLICY_DEFAULTS.max_in_flight_requests, gt=0)

    # Agents: the heartbeat interval the Conductor asks for, and the silence that declares
    # an agent dead (its blocks leave the index, its requests are re-routed or failed).
    heartbeat_interval_s: Seconds = 1.0
    heartbeat_timeout_s: Seconds = 5.0
    # How often each instance's load is sampled into the database (the console's series).
    load_sample_interval_s: Seconds = 1.0
    # A request still unfinished this long after its arrival is cancelled (reason
    # "deadline"): its agents drop it, so no work runs on for a client long gone.
    request_deadline_s: Seconds = 600.0

    # Calibration (backend/policy/calibration.py): the cost model is refitted online from
    # the prefills and decode steps the agents measure, over a rolling window, never from
    # fewer points than these, moving at most this factor per refit, every interval and as
    # soon as a part's points have grown by `calibration_refit_growth` since its last fit.
    # Off: the profile stays.
    calibrate: bool = True
    calibration_window_s: Seconds = 600.0
    calibration_refit_interval_s: Seconds = 10.0
    calibration_min_prefill_points: int = Field(default=20, ge=3)
    calibration_min_decode_points: int = Field(default=50, ge=3)
    calibration_max_change_factor: float = Field(default=2.0, gt=1, allow_inf_nan=False)
    calibration_refit_growth: float = Field(default=2.0, gt=1, allow_inf_nan=False)

    # What the REST API serves: the model name clients must ask for, and the longest prompt
    # and output it accepts (longer ones get 400 before anything is admitted).
    served_model: str = Field(default="tiny", min_length=1, max_length=128)
    max_input_tokens: int = Field(default=4096, gt=0)
    max_output_tokens: int = Field(default=1024, gt=0, le=131_072)  # schemas' MAX_TOKENS_CAP

    # REST bodies above this many bytes are refused with 413 before they are read.
    max_request_body_bytes: int = Field(default=8 << 20, ge=1024)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, ConfigFileSource(settings_cls)

    @model_validator(mode="before")
    @classmethod
    def _default_database_url(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("database_url"):
            data_dir = data.get("data_dir", Path("data"))
            if isinstance(data_dir, str | Path):
                path = (Path(data_dir) / DATABASE_FILE_NAME).as_posix()
                data = {**data, "database_url": f"sqlite:///{path}"}
        return data

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_api_keys(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.split(",")
        if isinstance(value, list | tuple):
            return [
                parse_api_key(item) if isinstance(item, str) else item
                for item in value
                if not (isinstance(item, str) and not item.strip())
            ]
        return value

    @field_validator("api_keys")
    @classmethod
    def _check_api_keys_distinct(cls, entries: list[ApiKeyEntry]) -> list[ApiKeyEntry]:
        names = [entry.name for entry in entries]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"each key needs its own name; repeated: {', '.join(repeated)}")
        keys = [entry.key.get_secret_value() for entry in entries]
        if len(set(keys)) != len(keys):
            raise ValueError("the same key is listed more than once")
        return entries

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, url: str) -> str:
        # Never echo the URL: it may carry a password.
        scheme = url.split("://", 1)[0] if "://" in url else ""
        if scheme == "postgres":
            raise ValueError("use the postgresql:// scheme (SQLAlchemy refuses postgres://)")
        if scheme.split("+", 1)[0] not in _DATABASE_SCHEMES:
            shown = f"scheme {scheme!r}" if scheme else "no scheme"
            raise ValueError(f"must be a sqlite:// or postgresql[+driver]:// URL, got {shown}")
        return url

    @model_validator(mode="after")
    def _check_whole(self) -> "ConductorSettings":
        problems = self._missing_secrets() + self._reused_secrets()
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            problems.append(
                f"heartbeat_timeout_s ({self.heartbeat_timeout_s:g}) must be longer than "
                f"heartbeat_interval_s ({self.heartbeat_interval_s:g}), or live agents are "
                "declared dead between two heartbeats"
            )
        try:
            self.policy_config()
        except ValueError as error:  # the policy's own rules, should the fields above miss one
            problems.append(str(error))
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def _missing_secrets(self) -> list[str]:
        if self.dev:
            return []
        # Secrets have no command-line flags: a flag's value shows in every process listing.
        missing = [
            (what, name, example)
            for what, name, value, example in (
                ("no API keys", "api_keys", self.api_keys, "NAME:KEY[,NAME:KEY...]"),
                ("no admin token", "admin_token", self.admin_token, "TOKEN"),
                ("no agent secret", "agent_secret", self.agent_secret, "SECRET"),
            )
            if not value
        ]
        return [
            f"{what}: set {ENV_PREFIX}{name.upper()}={example} (or {name} in the --config "
            "file), or start with --dev to generate development secrets"
            for what, name, example in missing
        ]

    def _reused_secrets(self) -> list[str]:
        keys = {entry.key.get_secret_value() for entry in self.api_keys}
        admin = self.admin_token.get_secret_value() if self.admin_token else None
        agent = self.agent_secret.get_secret_value() if self.agent_secret else None
        problems = []
        if admin is not None and admin in keys:
            problems.append("admin_token must differ from every API key")
        if agent is not None and (agent in keys or agent == admin):
            problems.append("agent_secret must differ from the admin token and every API key")
        return problems

    def calibration_config(self) -> CalibrationConfig:
        return CalibrationConfig(
            window_s=self.calibration_window_s,
            min_prefill_points=self.calibration_min_prefill_points,
            min_decode_points=self.calibration_min_decode_points,
            max_change_factor=self.calibration_max_change_factor,
            refit_interval_s=self.calibration_refit_interval_s,
            refit_growth=self.calibration_refit_growth,
        )

    def policy_config(self) -> PolicyConfig:
        """The policy core's narrow, frozen config: its knobs and nothing else."""
        return PolicyConfig(
            block_size=self.block_size,
            prefill_scheduler=self.prefill_scheduler,
            kvcache_balancing_threshold=self.kvcache_balancing_threshold,
            rejection_policy=self.rejection_policy,
            eviction_policy=self.eviction_policy,
            ttft_slo_s=self.ttft_slo_s,
            tbt_slo_s=self.tbt_slo_s,
            decode_time_s=self.decode_time_s,
            learn_decode_time=self.learn_decode_time,
            decode_time_window=self.decode_time_window,
            predicted_load_limit=self.predicted_load_limit,
            predicted_size_weight=self.predicted_size_weight,
            seed=self.seed,
            max_in_flight_requests=self.max_in_flight_requests,
        )
