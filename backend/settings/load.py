"""load_settings: build ConductorSettings from flags, environment and config file, and turn
every validation problem into one line that names where the bad value came from
(`--port`, `KVC_PORT`, `config file c.toml: line 3: port`), never a pydantic traceback."""

import os
import re
import secrets
import sys
from collections.abc import Callable, Mapping
from difflib import get_close_matches
from pathlib import Path
from typing import Any

import pydantic_settings
from pydantic import SecretStr, ValidationError
from pydantic_core import ErrorDetails

from backend.settings.conductor import ENV_PREFIX, ApiKeyEntry, ConductorSettings
from backend.settings.config_file import CONFIG_FILE_FIELD, ConfigFile, read_config_file
from backend.settings.errors import SettingsError

# Values of these fields are never repeated in an error: they are, or may hold, secrets.
_SECRET_FIELDS = frozenset({"api_keys", "admin_token", "agent_secret", "database_url"})
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$|^[+-]?(inf|nan)$", re.I)
_DEV_SECRET_BYTES = 32


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def load_settings(
    flags: Mapping[str, Any],
    config_file: Path | None = None,
    *,
    announce: Callable[[str], None] = _to_stderr,
) -> ConductorSettings:
    """The validated settings, or a SettingsError with one line per problem.

    `flags` maps field names to the command line's values (None: flag not given). The config
    file is `config_file`, else KVC_CONFIG_FILE, else none. In development mode (`dev`), each
    missing secret is generated at random and passed to `announce` once (stderr by default).
    """
    given = {name: value for name, value in flags.items() if value is not None}
    if config_file is not None:
        given[CONFIG_FILE_FIELD] = config_file
    try:
        settings = ConductorSettings(**given)
    except ValidationError as error:
        file = _config_file_for_labels(given)
        raise SettingsError(
            [line for details in error.errors() for line in _describe(details, given, file)]
        ) from None
    except pydantic_settings.SettingsError as error:
        raise SettingsError([str(error)]) from None
    if settings.dev:
        settings = _with_dev_secrets(settings, announce)
    return settings


def _with_dev_secrets(
    settings: ConductorSettings, announce: Callable[[str], None]
) -> ConductorSettings:
    update: dict[str, Any] = {}
    shown: list[str] = []
    if not settings.api_keys:
        key = secrets.token_urlsafe(_DEV_SECRET_BYTES)
        update["api_keys"] = [ApiKeyEntry(name="dev", key=SecretStr(key))]
        shown.append(f"{ENV_PREFIX}API_KEYS=dev:{key}")
    for name in ("admin_token", "agent_secret"):
        if getattr(settings, name) is None:
            value = secrets.token_urlsafe(_DEV_SECRET_BYTES)
            update[name] = SecretStr(value)
            shown.append(f"{ENV_PREFIX}{name.upper()}={value}")
    if not update:
        return settings
    announce(
        "development mode: generated the secrets below; they are shown only now and "
        "change at every start (set them to keep them)"
    )
    for line in shown:
        announce(f"  {line}")
    return settings.model_copy(update=update)


def _env_value_present(name: str) -> bool:
    wanted = f"{ENV_PREFIX}{name}".upper()
    return any(key.upper() == wanted for key in os.environ)


def _config_file_for_labels(given: Mapping[str, Any]) -> ConfigFile | None:
    path = given.get(CONFIG_FILE_FIELD)
    if path is None:
        wanted = f"{ENV_PREFIX}{CONFIG_FILE_FIELD}".upper()
        path = next((v for k, v in os.environ.items() if k.upper() == wanted and v), None)
    if path is None:
        return None
    try:
        return read_config_file(Path(path))
    except SettingsError:
        return None


def _label(name: str, given: Mapping[str, Any], file: ConfigFile | None) -> str:
    """Where the value of setting `name` came from, by the precedence of the sources."""
    if name in given:
        return "--" + name.replace("_", "-")
    if _env_value_present(name):
        return f"{ENV_PREFIX}{name.upper()}"
    if file is not None and name in file.values:
        return file.where(name)
    return name


def _describe(
    details: ErrorDetails, given: Mapping[str, Any], file: ConfigFile | None
) -> list[str]:
    loc = details["loc"]
    if not loc:  # a rule across fields: its message names them
        return _message(details, None).split("\n")
    name = str(loc[0])
    parts = [_label(name, given, file)]
    parts += [f"entry {part + 1}" if isinstance(part, int) else str(part) for part in loc[1:]]
    message = _message(details, name if len(loc) == 1 else None)
    if details["type"] == "extra_forbidden":
        close = get_close_matches(name, ConductorSettings.model_fields, n=1)
        message += f" (did you mean {close[0]!r}?)" if close else ""
    elif name not in _SECRET_FIELDS and details["type"] not in ("value_error", "missing"):
        message += f", got {_show(details['input'])}"
    return [f"{': '.join(parts)}: {message}"]


def _message(details: ErrorDetails, field: str | None) -> str:
    """A short, lower-case message for one pydantic error, in this project's words."""
    kind = details["type"]
    ctx = details.get("ctx", {})
    if kind == "value_error":
        return str(ctx.get("error", details["msg"]))
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return _bounds_message(kind, ctx, field)
    fixed = {
        "missing": "is required",
        "extra_forbidden": "unknown setting",
        "int_parsing": "must be an integer",
        "int_type": "must be an integer",
        "int_from_float": "must be a whole number",
        "float_parsing": "must be a number",
        "float_type": "must be a number",
        "finite_number": "must be a finite number",
        "bool_parsing": "must be true or false",
        "bool_type": "must be true or false",
        "string_type": "must be a string",
        "list_type": "must be a list (or, in the environment, a comma-separated string)",
        "path_type": "must be a path",
    }
    if kind in fixed:
        return fixed[kind]
    if kind == "literal_error":
        return f"must be one of {ctx['expected']}"
    if kind in ("string_too_short", "too_short"):
        return f"must be at least {ctx['min_length']} characters"
    msg = details["msg"]
    return msg[:1].lower() + msg[1:]


def _bounds_message(kind: str, ctx: Mapping[str, Any], field: str | None) -> str:
    if field is not None:
        metadata = ConductorSettings.model_fields[field].metadata
        low = next((m.ge for m in metadata if hasattr(m, "ge")), None)
        high = next((m.le for m in metadata if hasattr(m, "le")), None)
        if low is not None and high is not None:
            return f"must be between {low} and {high}"
    words = {
        "greater_than": ("must be greater than", "gt"),
        "greater_than_equal": ("must be at least", "ge"),
        "less_than": ("must be less than", "lt"),
        "less_than_equal": ("must be at most", "le"),
    }
    text, key = words[kind]
    return f"{text} {ctx[key]}"


def _show(value: Any) -> str:
    if isinstance(value, str) and _NUMBER.match(value.strip()):
        return value.strip()
    if isinstance(value, dict):
        return "a table"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
