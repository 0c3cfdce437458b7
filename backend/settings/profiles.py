"""Timing profiles by name or file: what the Conductor's cost model, the agents and the twin
start from. The built-in ones ship as package data next to this module; reading one is the
only I/O here (ValueError in one line for a missing or malformed file)."""

import json
from importlib import resources
from pathlib import Path
from typing import Any

# "paper": LLaMA2-70B on 8 A800s (the roofline the twin derives, docs/twin-timing.md);
# "tiny-cpu": the `tiny` agents measured by `kvcentric profile` on this project's reference
# 2-core CPU machine, what `kvcentric up` starts from before its calibration takes over;
# "smollm2-cpu": the real SmolLM2-135M the same way (`kvcentric profile --model smollm2-135m
# --quick --block-size 16`, an AMD EPYC 2-core machine), for `kvcentric up --model`.
BUILTIN_PROFILES = {
    "paper": "paper-llama2-70b-8xa800.json",
    "tiny-cpu": "tiny-cpu.json",
    "smollm2-cpu": "smollm2-cpu.json",
}


def profile_path(profile: str) -> Path:
    """The file of a built-in profile by name, or `profile` itself as a path."""
    if profile in BUILTIN_PROFILES:
        return Path(
            str(resources.files("backend.settings") / "profiles" / BUILTIN_PROFILES[profile])
        )
    return Path(profile)


def read_profile(profile: str) -> tuple[Any, str]:
    """The JSON of a built-in profile by name ("paper", "tiny-cpu") or of a profile file, and
    how to name it in messages; ValueError in one line."""
    if profile in BUILTIN_PROFILES:
        where = f"built-in profile {profile!r}"
    else:
        where = f"profile {profile!r}"
        if not Path(profile).is_file():
            raise ValueError(
                f"{where} is neither a built-in ({', '.join(BUILTIN_PROFILES)}) nor a file"
            )
    text = profile_path(profile).read_text()
    try:
        return json.loads(text), where
    except json.JSONDecodeError as error:
        raise ValueError(f"{where} is not valid JSON: {error}") from None
