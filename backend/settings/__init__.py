"""The Conductor's settings: one validated `ConductorSettings`, loaded from flags, `KVC_*`
environment variables and a TOML config file (in that order of precedence) by `load_settings`,
which turns every problem into one readable line of a `SettingsError`.

The policy core never sees these settings: `ConductorSettings.policy_config()` hands it the
narrow, frozen `PolicyConfig`.
"""

from backend.settings.conductor import ApiKeyEntry, ConductorSettings
from backend.settings.config_file import ConfigFile, read_config_file
from backend.settings.errors import SettingsError
from backend.settings.load import load_settings

__all__ = [
    "ApiKeyEntry",
    "ConductorSettings",
    "ConfigFile",
    "SettingsError",
    "load_settings",
    "read_config_file",
]
