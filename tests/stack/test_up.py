"""`kvcentric up` end to end: conductor, agents and a short replay, then a clean Ctrl-C."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from backend.cli.children import free_port
from tests.harness.processes import alive, children_of

KVCENTRIC = str(Path(sys.executable).parent / "kvcentric")
_SUMMARY = re.compile(r"(\d+) requests in [\d.]+ s: .*completed (\d+)")

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc for children")


def test_up_replays_then_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    args = [
        KVCENTRIC, "up", "--minutes", "0:0.2", "--length-scale", "0.02", "--speed", "8",
        "--warmup-tokens", "300", "--data-dir", str(tmp_path / "data"), "--port", str(free_port()),
        "--grpc-port", str(free_port()), "--console-port", str(free_port()),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVC_")}
    process = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    lines: list[str] = []
    finished = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if "replay finished" in line or "replay failed" in line:
                finished.set()
        finished.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert finished.wait(50), "".join(lines)
        output = "".join(lines)
        assert "replay finished" in output, output
        summary = _SUMMARY.search(output)
        assert summary is not None, output
        assert int(summary.group(2)) > 0, output
        assert "KVC_API_KEY=" in output and "/docs" in output and "logs:" in output
        assert "console:" in output.lower(), output
        children = children_of(process.pid)
        assert len(children) == 5, children  # conductor + 2 prefill + 1 decode + console
        # Ctrl-C and a parent's SIGTERM at once: one clean stop, not one cut short.
        process.send_signal(signal.SIGINT)
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, "".join(lines)
        reader.join(5)  # the last lines, read to the pipe's end
        assert "stopping ..." in "".join(lines) and "stopped" in "".join(lines)
        deadline = time.monotonic() + 5
        while any(alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(pid) for pid in children), children
        conductor_log = (tmp_path / "data" / "logs" / "conductor.log").read_text()
        # One access line per HTTP request, with status and latency; no Alembic chatter.
        assert re.search(r"kvcentric.access: POST /v1/native/requests 200 [\d.]+ ms", conductor_log)
        assert "setup plugin" not in conductor_log
        # --warmup-tokens reaches the prefill agents, which warm up before they serve.
        logs = tmp_path / "data" / "logs"
        for name in ("prefill-0", "prefill-1"):
            assert f"agent {name} warmed up in" in (logs / f"agent-{name}.log").read_text()
        assert "warmed up" not in (logs / "agent-decode-0.log").read_text()
        # The secrets printed once are kept for later, readable by the user only.
        secrets_file = tmp_path / "data" / "secrets.env"
        assert secrets_file.stat().st_mode & 0o777 == 0o600
        api_key = re.search(r"KVC_API_KEY=(\S+)", output).group(1)
        assert f"KVC_API_KEY={api_key}\n" in secrets_file.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _pid_of(parent: int, *words: str) -> int:
    """The child of `parent` whose command line holds every one of `words`."""
    for pid in children_of(parent):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if all(word.encode() in command for word in words):
            return pid
    raise AssertionError(f"no child of {parent} runs {words}")


def _get(url: str, api_key: str) -> object | None:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"})
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return json.loads(response.read())
    except (OSError, ValueError):
        return None


def _wait(condition, what: str, lines: list[str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{''.join(lines)}"
        time.sleep(0.2)


def test_up_starts_a_killed_agent_and_a_killed_conductor_again(tmp_path: Path) -> None:
    """SIGKILL of an agent, then of the Conductor: each is reported and started again (the
    agent under its instance id, the Conductor on its database, which its agents rejoin),
    the rest keeps serving, and Ctrl-C still stops everything with exit 0."""
    port = free_port()
    args = [
        KVCENTRIC, "up", "--no-replay", "--no-console", "--data-dir", str(tmp_path / "data"),
        "--port", str(port), "--grpc-port", str(free_port()),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVC_")}
    process = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True).start()
    base = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: "Ctrl-C stops it" in "".join(lines), "the stack", lines, 120)
        api_key = re.search(r"KVC_API_KEY=(\S+)", "".join(lines)).group(1)

        def joined() -> dict[str, str]:
            agents = _get(f"{base}/v1/agents", api_key) or []
            return {a["instance_id"]: a["state"] for a in agents}

        assert len(joined()) == 3
        agent = _pid_of(process.pid, "agent", "prefill-0")
        os.kill(agent, signal.SIGKILL)
        _wait(lambda: "prefill-0 restarted" in "".join(lines), "the agent's restart", lines)
        new_agent = _pid_of(process.pid, "agent", "prefill-0")
        assert new_agent != agent

        conductor = _pid_of(process.pid, "conductor")
        os.kill(conductor, signal.SIGKILL)
        _wait(lambda: "conductor restarted" in "".join(lines), "the conductor's restart", lines)
        _wait(lambda: len(joined()) == 3, "the agents to rejoin", lines, 90)
        body = json.dumps({"token_ids": list(range(1, 40)), "max_tokens": 4}).encode()
        request = urllib.request.Request(
            f"{base}/v1/native/requests",
            data=body,
            headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            assert json.loads(response.read())["state"] == "completed"
        assert process.poll() is None
        children = children_of(process.pid)
        process.send_signal(signal.SIGINT)
        assert process.wait(60) == 0, "".join(lines)
        assert not any(alive(pid) for pid in children)
        output = "".join(lines)
        assert "supervisor: agent prefill-0 exited with code -9" in output, output
        assert "supervisor: conductor exited with code -9" in output, output
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
