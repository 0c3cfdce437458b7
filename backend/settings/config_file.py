"""The TOML config file: reading it with line-numbered errors, and the pydantic-settings source
that ranks it below flags and `KVC_*` environment variables.

The file is flat: one `name = value` per setting, named as the fields of `ConductorSettings`
(e.g. `port = 8000`, `api_keys = ["alice:...", "bob:..."]`). Relative paths in it are taken
relative to the working directory, as on the command line.
"""

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import PydanticBaseSettingsSource

from backend.settings.errors import SettingsError

# The file names itself by a flag or KVC_CONFIG_FILE; naming another file inside it is refused.
CONFIG_FILE_FIELD = "config_file"

_TOML_POSITION = re.compile(r"^(?P<message>.*) \(at line (?P<line>\d+), column (?P<column>\d+)\)$")


@dataclass(frozen=True, slots=True)
class ConfigFile:
    """A parsed config file: its top-level values and where each was written."""

    path: Path
    values: dict[str, Any]
    lines: tuple[str, ...] = field(default=(), repr=False)

    def line_of(self, key: str) -> int | None:
        """The 1-based line that sets top-level `key`, if it can be found."""
        pattern = re.compile(rf"""^\s*(["']?){re.escape(key)}\1\s*=""")
        for number, line in enumerate(self.lines, start=1):
            if pattern.match(line):
                return number
        return None

    def where(self, key: str) -> str:
        """`config file PATH: line N: key`, the label of an error about `key`."""
        line = self.line_of(key)
        at = f" line {line}:" if line is not None else ""
        return f"config file {self.path}:{at} {key}"


def read_config_file(path: Path) -> ConfigFile:
    """Parse the TOML file at `path`; a missing, unreadable or malformed file is a SettingsError."""
    label = f"config file {path}"
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise SettingsError([f"{label}: not found"]) from None
    except IsADirectoryError:
        raise SettingsError([f"{label}: is a directory, not a TOML file"]) from None
    except UnicodeDecodeError:
        raise SettingsError([f"{label}: not UTF-8 text"]) from None
    except OSError as error:
        raise SettingsError([f"{label}: cannot read it ({error.strerror})"]) from None
    try:
        values = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        match = _TOML_POSITION.match(str(error))
        if match is None:
            raise SettingsError([f"{label}: invalid TOML: {error}"]) from None
        message = match["message"][:1].lower() + match["message"][1:]
        raise SettingsError(
            [f"{label}: line {match['line']}: {message} (column {match['column']})"]
        ) from None
    config = ConfigFile(path=path, values=values, lines=tuple(text.splitlines()))
    if CONFIG_FILE_FIELD in values:
        raise SettingsError(
            [f"{config.where(CONFIG_FILE_FIELD)}: cannot be set inside a config file"]
        )
    return config


class ConfigFileSource(PydanticBaseSettingsSource):
    """The values of the config file named by the sources above it (a flag or KVC_CONFIG_FILE)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        # Unused: __call__ returns the whole file at once (unknown keys must reach validation).
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = self.current_state.get(CONFIG_FILE_FIELD)
        if path is None or path == "":
            return {}
        return read_config_file(Path(path)).values
