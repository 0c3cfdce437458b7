"""The secrets `kvcentric up` generates, kept in a file only the user can read.

`up` writes `DATA_DIR/secrets.env` (mode 0600, shell syntax: `set -a; . data/secrets.env`)
so a lost terminal does not mean a restart; `kvcentric console` and `kvcentric replay` read
it when their key or URL is not given. Nothing else is kept there.
"""

import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path

FILE_NAME = "secrets.env"
DEFAULT_PATH = Path("data") / FILE_NAME
_LINE = re.compile(r"^(KVC_[A-Z0-9_]+)=(.*)$")


def write_secrets(path: Path, values: Mapping[str, str]) -> Path:
    """Write `values` as KEY=VALUE lines to `path`, readable and writable by the user only
    (the file is created 0600 and made so if it existed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        os.fchmod(file.fileno(), 0o600)
        file.write("# written by `kvcentric up`; load with: set -a; . THIS_FILE; set +a\n")
        for key, value in values.items():
            file.write(f"{key}={value}\n")
    return path


def read_secrets(path: Path) -> dict[str, str]:
    """The KEY=VALUE lines of a secrets file (comments and blank lines skipped); {} when there
    is no such file. ValueError when others than the user may read it."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return {}
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(
            f"{path} is readable by others (mode {stat.S_IMODE(mode):o}); "
            f"run `chmod 600 {path}` first"
        )
    values = {}
    for line in path.read_text().splitlines():
        if match := _LINE.match(line.strip()):
            values[match.group(1)] = match.group(2)
    return values
