"""Every `--option` a message or help text names exists: an error that says "use --api-keys"
when there is no such flag sends the user nowhere."""

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from backend.cli import app
from backend.settings import SettingsError, load_settings

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("backend", "agents", "console", "twin")
# Files whose strings are other programs' command lines (protoc's generator flags).
FOREIGN = {Path("backend/rpc/regenerate.py")}
# `--name`, not `--server.address` (streamlit's own flags on the console's command line).
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*(?![\w.-])")


def _commands(command: Any) -> Iterator[Any]:
    yield command
    if hasattr(command, "commands"):
        for sub in command.commands.values():
            yield from _commands(sub)


# Other programs' options in our strings: pip's (the model's weights), wrk's (the command
# line `bench admission --client wrk` runs).
THEIRS = {"--no-deps", "--timeout"}
KNOWN = (
    {"--help"}
    | THEIRS
    | {
        option
        for command in _commands(typer.main.get_command(app))
        for param in command.params
        for option in (*param.opts, *param.secondary_opts)
        if option.startswith("--")
    }
)


def _named_options() -> Iterator[tuple[str, int, str]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.relative_to(ROOT) in FOREIGN:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    for option in OPTION.findall(node.value):
                        yield str(path.relative_to(ROOT)), node.lineno, option


def test_the_scan_sees_the_options_messages_name() -> None:
    named = {option for _, _, option in _named_options()}
    assert {"--dev", "--block-size", "--changes", "--profile"} <= named


def test_every_option_a_string_of_ours_names_exists() -> None:
    unknown = [
        f"{path}:{line}: {option}" for path, line, option in _named_options() if option not in KNOWN
    ]
    assert not unknown, "options named in messages but defined by no command:\n" + "\n".join(
        unknown
    )


def test_the_missing_secrets_messages_name_variables_and_options_that_exist(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("KVC_API_KEYS", "KVC_ADMIN_TOKEN", "KVC_AGENT_SECRET", "KVC_DEV"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SettingsError) as raised:
        load_settings({}, None)
    problems = raised.value.problems
    assert len(problems) == 3
    for problem in problems:
        assert set(OPTION.findall(problem)) <= KNOWN, problem
        (variable,) = re.findall(r"\bKVC_[A-Z_]+", problem)
        assert variable in typer.main.get_command(app).commands["conductor"].epilog
