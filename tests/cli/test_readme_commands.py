"""Every command line the README and the `--help` epilogues show works when pasted: each one
parses (subcommand, options, values), and the README's by-hand block runs a stack and a
replay as printed (ports aside)."""

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from backend.cli import app
from backend.cli.children import free_port
from backend.traces import SHIPPED_TRACE

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
# The README's placeholders, by what they stand for.
_BAR = "\x01"
PLACEHOLDERS = {"FILE": str(SHIPPED_TRACE), "N": "64", "K": "a-key", "S": "a-secret"}


def _code_blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def _command_lines(block: str) -> Iterator[str]:
    """Each `kvcentric ...` line of a block, continuation lines joined, comments cut."""
    joined = re.sub(r"\\\n\s*", " ", block)
    for line in joined.splitlines():
        line = line.strip()
        if re.match(r"^([A-Z_]+=(\$\([^)]*\)|\S)+\s+)*kvcentric\s", line):
            yield line


def _words(line: str) -> list[str]:
    """The arguments bash would pass (its own expansions done by bash), without the leading
    VAR=value assignments and the `kvcentric` itself."""
    shown = line.split(" #", 1)[0].rstrip(" &").replace("|", _BAR)  # `a|b`: alternatives
    words = subprocess.run(
        ["bash", "-c", f"set -- {shown}; printf '%s\\0' \"$@\""],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "KEY": "a-key"},
    ).stdout.split("\0")[:-1]
    while words and re.match(r"^[A-Z_]+=", words[0]):
        words.pop(0)
    assert words[0] == "kvcentric", line
    words = [re.sub(r"^\[(.*)\]$", r"\1", word.replace(_BAR, "|")) for word in words[1:]]
    return [PLACEHOLDERS.get(word, word) for word in words]  # `[--json]`: shown optional


def _alternatives(words: list[str]) -> list[list[str]]:
    """`bench transport|layerwise|...` is one command per alternative; an option's value
    `lru|lfu|length-aware` takes its first."""
    expanded: list[list[str]] = [[]]
    for index, word in enumerate(words):
        options = word.split("|") if "|" in word and "{" not in word else [word]
        after_option = index > 0 and words[index - 1].startswith("--")
        if after_option:
            options = options[:1]
        expanded = [[*prefix, option] for prefix in expanded for option in options]
    return expanded


def _parse(words: list[str]) -> Any:
    """Parse as the command line would, down to the subcommand; raises the usage errors of
    typer's (vendored) click, which have `format_message`."""
    command = typer.main.get_command(app)
    context = command.make_context("kvcentric", list(words))
    while hasattr(command, "commands"):  # a group
        arguments = [*context._protected_args, *context.args]
        name, command, rest = command.resolve_command(context, arguments)
        assert command is not None, words
        context = command.make_context(name, rest, parent=context)
    return context


def _shown_command_lines() -> list[tuple[str, tuple[str, ...]]]:
    """Each command line shown, with the variables its block exports before it."""
    blocks = _code_blocks(README.read_text())
    blocks += [command.epilog or "" for command in _all_commands(typer.main.get_command(app))]
    return [
        (
            line,
            tuple(re.findall(r"\b([A-Z_]+)=", " ".join(re.findall(r"^export (.*)$", block, re.M)))),
        )
        for block in blocks
        for line in _command_lines(block)
    ]


def _all_commands(command: Any) -> Iterator[Any]:
    yield command
    if hasattr(command, "commands"):
        for sub in command.commands.values():
            yield from _all_commands(sub)


SHOWN = _shown_command_lines()


def test_the_readme_and_the_epilogues_show_commands() -> None:
    assert len(SHOWN) >= 20
    assert any(line.startswith("KVC_API_KEYS=") for line, _ in SHOWN)  # the conductor's epilog


@pytest.mark.parametrize(("line", "exported"), SHOWN)
def test_every_command_line_shown_parses_as_printed(
    line: str, exported: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in exported:  # what the block's `export` lines set before it
        monkeypatch.setenv(name, "a-value")
    for words in _alternatives(_words(line)):
        try:
            _parse(words)
        except Exception as error:
            if not hasattr(error, "format_message"):
                raise
            pytest.fail(f"{line!r}: {error.format_message()}")


def _by_hand_block() -> str:
    (block,) = [b for b in _code_blocks(README.read_text()) if "kvcentric agent" in b]
    return block


def test_the_by_hand_block_starts_a_stack_and_replays_against_it(tmp_path: Path) -> None:
    """The README's by-hand commands, run as printed in one shell (the ports swapped for
    free ones): the agents join, the replay completes requests, `kill` stops the parts."""
    block = _by_hand_block()
    for port in sorted(set(re.findall(r"(?<=:)(\d{4,5})\b", block))):
        block = re.sub(rf"(?<=[:= ]){port}\b", str(free_port()), block)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVC_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    script = f"set -m\n{block}\nwait\n"  # job control: `kill %1` names the background jobs
    process = subprocess.Popen(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"the by-hand block did not finish:\n{output[-4000:]}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    summary = re.search(r"(\d+) requests in [\d.]+ s: .*completed (\d+)", output)
    assert summary is not None and int(summary.group(2)) > 0, output[-4000:]
    assert "joined conductor" in output, output[-4000:]
    assert (tmp_path / "results.jsonl").is_file()


def test_the_readme_and_the_docs_cite_nothing_outside_the_repository() -> None:
    """A reader of the repository has the repository: no DESIGN.md, STYLE.md or ../shared."""
    outside = re.compile(r"DESIGN\.md|STYLE\.md|\.\./shared")
    cited = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in [README, *sorted((ROOT / "docs").rglob("*.md"))]
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if outside.search(line)
    ]
    assert not cited, cited
