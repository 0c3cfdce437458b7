"""The processes of a stack started from the command line (`kvcentric up`, `twin validate`,
`bench admission`, `chaos`): each child with its log, waiting until they are ready,
stopping them in order, also when the command is interrupted (`stop_on_signals`).
"""

import contextlib
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Protocol

KVCENTRIC = str(Path(sys.executable).parent / "kvcentric")
SECRET_BYTES = 32
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
EXIT_INTERRUPTED = 130  # the shell's code for a command ended by Ctrl-C (128 + SIGINT)


class ChildFailed(Exception):
    """A child exited (or never got ready) while the stack was starting."""


def stop_on_signals() -> None:
    """Make SIGINT and SIGTERM raise KeyboardInterrupt in the main thread, so that a command
    which started children stops them on its way out: the children run in sessions of their
    own and see neither signal, and SIGTERM's default would end the command at once,
    leaving its stack running. SIGINT even where the shell started the command ignoring it
    (a background job). The first signal ignores later ones, so that a second (Ctrl-C and a
    parent's SIGTERM at once) cannot cut the stop short."""
    signal.signal(signal.SIGINT, _raise_interrupt)
    signal.signal(signal.SIGTERM, _raise_interrupt)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    ignore_signals()
    raise KeyboardInterrupt


def ignore_signals() -> None:
    """Ignore SIGINT and SIGTERM from now on (while a stack stops)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


@contextlib.contextmanager
def signals_held():
    """Within: a first SIGINT or SIGTERM does not cut the work short but is held, and raised
    as KeyboardInterrupt on leaving (later ones ignored), so that a stack already stopping
    when the signal lands stops all of it before the command ends. Only where
    `stop_on_signals` is in force, in the main thread; anywhere else it changes nothing."""
    in_force = signal.getsignal(signal.SIGTERM) is _raise_interrupt
    if not in_force or threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        ignore_signals()
        arrived.append(signum)

    signal.signal(signal.SIGINT, hold)
    signal.signal(signal.SIGTERM, hold)
    try:
        yield
    finally:
        if not arrived:
            stop_on_signals()
    if arrived:
        raise KeyboardInterrupt


def spawn_into(children: list["Child"], make: Callable[[], "Child"]) -> "Child":
    """`make()` a child and add it to `children`, a SIGINT or SIGTERM held until it is
    there: one landing inside the spawn, after the fork, would otherwise leave a running
    child that no `finally` stopping `children` knows of."""
    with signals_held():
        child = make()
        children.append(child)
    return child


# The CPU priority of agents sharing a machine with the Conductor: they yield a core to it
# when both want one, so a 429 or /healthz answer does not wait behind torch compute (with
# 200 clients on 2 shared cores: 429 p99 ~20 ms at 10, 190-370 ms at 0; docs/benchmarks.md).
# The agents still get every cycle the Conductor does not use.
AGENT_NICE = 10


class Child:
    """One subprocess of the stack, its output in a log file (appended to on a restart).
    `nice`: its CPU priority below the parent's (see `lower_priority`)."""

    def __init__(
        self,
        name: str,
        args: list[str],
        env: dict[str, str],
        log: Path,
        *,
        stdout_pipe: bool,
        nice: int = 0,
    ) -> None:
        self.name = name
        self.log = log
        self._args, self._env, self._stdout_pipe = args, env, stdout_pipe
        self._nice = nice
        self._log_file: IO[str] = log.open("w")
        self.process = self._spawn()

    def _spawn(self) -> "subprocess.Popen[str]":
        process = self._popen()
        if self._nice:
            lower_priority(process.pid, self._nice)
        return process

    def _popen(self) -> "subprocess.Popen[str]":
        return subprocess.Popen(
            self._args,
            stdout=subprocess.PIPE if self._stdout_pipe else self._log_file,
            stderr=self._log_file,
            stdin=subprocess.DEVNULL,
            env=self._env,
            text=True,
            # Its own session: Ctrl-C reaches `up` only, which stops the children in order.
            start_new_session=True,
        )

    def check_alive(self) -> None:
        code = self.process.poll()
        if code is not None:
            raise ChildFailed(f"{self.name} exited with code {code}; see its log {self.log}")

    def restart(self) -> None:
        """Start it again with the same command line and environment (a dead child only)."""
        assert self.process.poll() is not None, f"{self.name} is still running"
        self._log_file.write(f"\n--- restarted by the supervisor at {time.ctime()} ---\n")
        self._log_file.flush()
        self.process = self._spawn()

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()

    def wait(self) -> None:
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log_file.close()


def lower_priority(pid: int, nice: int) -> None:
    """Give process `pid` the nice value `nice` (a lower CPU priority), best effort: its own
    (the threads it starts later inherit it) and, where the kernel groups each session for fairness
    (autogroup; every child here has a session of its own), its session's, without which a
    nice value only ranks threads inside one session."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")


class Supervisor:
    """Keeps a stack's children running: one that exits is reported and started again after
    a backoff that doubles with each exit of it (from `first_backoff_s` to `max_backoff_s`),
    the same command line (an agent under its instance id, the Conductor on its database).
    A child that exits `max_exits` times within `window_s` keeps dying: `poll` raises
    ChildFailed naming it, and the caller stops the stack. Called from one thread."""

    def __init__(
        self,
        children: list[Child],
        report: Callable[[str], None],
        *,
        first_backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        max_exits: int = 5,
        window_s: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.children = children
        self.report = report
        self.first_backoff_s, self.max_backoff_s = first_backoff_s, max_backoff_s
        self.max_exits, self.window_s = max_exits, window_s
        self._clock = clock
        self._exits: dict[str, list[float]] = {}  # child name -> times it exited
        self._restart_at: dict[str, float] = {}  # child name -> when to start it again
        self.num_restarts = 0

    def poll(self) -> None:
        """Notice exits and start again the children whose backoff has passed."""
        now_s = self._clock()
        for child in self.children:
            name = child.name
            if name in self._restart_at:
                if now_s >= self._restart_at[name]:
                    del self._restart_at[name]
                    child.restart()
                    self.num_restarts += 1
                    self.report(f"{name} restarted (pid {child.process.pid})")
                continue
            code = child.process.poll()
            if code is None:
                continue
            exits = [t for t in self._exits.get(name, []) if now_s - t < self.window_s]
            exits.append(now_s)
            self._exits[name] = exits
            if len(exits) >= self.max_exits:
                raise ChildFailed(
                    f"{name} keeps dying: {len(exits)} exits in {self.window_s:.0f} s (the last "
                    f"with code {code}); see its log {child.log}"
                )
            backoff_s = min(self.first_backoff_s * 2 ** (len(exits) - 1), self.max_backoff_s)
            self._restart_at[name] = now_s + backoff_s
            self.report(
                f"{name} exited with code {code}; starting it again in {backoff_s:g} s "
                f"(exit {len(exits)} of at most {self.max_exits - 1} in {self.window_s:.0f} s; "
                f"log {child.log})"
            )


class SupervisingThread:
    """A Supervisor's polls on a thread of their own, while the caller's thread does other
    work (relays a replay's output). A child that keeps dying terminates the replay (if
    any), and `check` raises its ChildFailed in the caller's thread."""

    def __init__(
        self,
        supervisor: Supervisor,
        replay: Callable[[], Child | None] = lambda: None,
        interval_s: float = 0.5,
    ) -> None:
        self._supervisor, self._replay, self.interval_s = supervisor, replay, interval_s
        self._failure: ChildFailed | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="supervisor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.wait(self.interval_s):
            try:
                self._supervisor.poll()
            except ChildFailed as error:
                self._failure = error
                running = self._replay()
                if running is not None:
                    running.terminate()
                return

    def check(self) -> None:
        if self._failure is not None:
            raise self._failure

    def stop(self) -> None:
        """No restart from now on (the stack is being stopped)."""
        self._stopping.set()
        self._thread.join(5)


def agent_names(num_prefill: int, num_decode: int) -> list[tuple[str, str]]:
    """(role, instance id) of a stack's agents, each role numbered from 0."""
    return [("prefill", f"prefill-{i}") for i in range(num_prefill)] + [
        ("decode", f"decode-{i}") for i in range(num_decode)
    ]


def agent_child(
    role: str,
    instance_id: str,
    *,
    block_size: int,
    conductor: str,
    env: dict[str, str],
    logs: Path,
    torch_threads: int | None = None,
    model: str = "tiny",
    host: "Host | None" = None,
    warmup_tokens: int = 0,
) -> Child:
    """An agent serving `model` on free ports that joins `conductor` ("host:port"): on
    loopback, or bound to `host`'s address inside it (a virtual host of its own). A prefill
    agent runs `warmup_tokens` of prompts before it serves (decode agents have none)."""
    address = host.address if host is not None else "127.0.0.1"
    args = [
        KVCENTRIC, "agent", "--role", role, "--listen", f"{address}:0",
        "--data-listen", f"{address}:0", "--model", model, "--instance-id", instance_id,
        "--block-size", str(block_size), "--conductor", conductor,
    ]  # fmt: skip
    if torch_threads is not None:
        args += ["--torch-threads", str(torch_threads)]
    if warmup_tokens and role == "prefill":
        args += ["--warmup-tokens", str(warmup_tokens)]
    if host is not None:
        args = host.command(args)
    log = logs / f"agent-{instance_id}.log"
    return Child(f"agent {instance_id}", args, env, log, stdout_pipe=False, nice=AGENT_NICE)


# The prefill agents of a stack that replays the shipped trace compute its longest prompt
# once before serving (3,944 tokens at the default length scale): their first requests then
# run at steady speed, which is what a short calibration window measures
# (agents/node/allocator.py).
WARMUP_TOKENS = 4096


def shared_host_threads(num_agents: int) -> int:
    """Torch threads for each of `num_agents` agents on this machine: its cores split
    between them (measured: 3 agents on 2 cores at 2 threads each made decode steps ~3x
    slower than at 1, docs/benchmarks.md)."""
    return max(1, (os.cpu_count() or 1) // num_agents)


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
STATIC_PORTS = (20000, 32768)  # below Linux's default ephemeral range
_given_ports: set[int] = set()  # never the same port twice from one process


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, for a child to bind a moment later.

    It is drawn below the kernel's ephemeral range: a port the kernel hands out (bind to 0)
    can be taken in between as the source port of any outgoing connection, which failed a
    late bind in CI ("Address already in use"). Falls back to the kernel's choice."""
    low, high = STATIC_PORTS
    with contextlib.suppress(OSError, ValueError, IndexError):
        high = min(high, int(EPHEMERAL_RANGE.read_text().split()[0]))
    for port in random.sample(range(low, high), k=min(64, max(0, high - low))):
        if port in _given_ports:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        _given_ports.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def get_json(url: str, api_key: str | None = None) -> object | None:
    """The JSON body of a 200 answer, else None (not answering yet)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=2) as r:
            return json.loads(r.read() or b"null") if r.status == 200 else None
    except (OSError, urllib.error.URLError, ValueError):
        return None


def answers(url: str) -> bool:
    """Whether `url` answers 200 (any body)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


def wait_for(what: str, ready, children: list[Child], timeout_s: float = START_TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while True:
        for child in children:
            child.check_alive()
        value = ready()
        if value:
            return value
        if time.monotonic() > deadline:
            raise ChildFailed(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.2)


def stop_stack(replay: Child | None, children: list[Child]) -> None:
    """The replay first, then the agents (at once), then the conductor; a Ctrl-C or SIGTERM
    arriving meanwhile is raised once all of them are stopped (`signals_held`)."""
    with signals_held():
        if replay is not None:
            replay.terminate()
            replay.wait()
        agents, conductor = children[1:], children[:1]
        for group in (agents, conductor):
            for child in group:
                child.terminate()
            for child in group:
                child.wait()


class Host(Protocol):
    """Where a child runs when not on this host's loopback: an address of its own, and the
    command that starts a process there (backend/bench/netns.py: a network namespace)."""

    @property
    def address(self) -> str: ...

    def command(self, args: list[str]) -> list[str]: ...


@dataclass
class LocalStack:
    """A Conductor (SQLite under `data_dir`, on free loopback ports) and its `tiny` agents,
    started as `kvcentric up` starts them, for the commands that run a stack of their own
    (`twin validate`, `chaos`). `children[0]` is the Conductor; then the agents, named
    "agent <instance id>"."""

    children: list[Child]
    base_url: str
    grpc_address: str
    api_key: str
    admin_token: str
    env: dict[str, str]
    logs: Path
    data_dir: Path

    @property
    def conductor(self) -> Child:
        return self.children[0]

    def agent(self, instance_id: str) -> Child:
        return next(c for c in self.children if c.name == f"agent {instance_id}")

    @property
    def database(self) -> Path:
        return self.data_dir / "kvcentric.db"

    def stop(self, replay: Child | None = None) -> None:
        """Stop the stack (and `replay` first, where one may still run)."""
        stop_stack(replay, self.children)


def start_local_stack(
    work_dir: Path,
    *,
    num_prefill: int,
    num_decode: int,
    block_size: int,
    profile: str,
    env: Mapping[str, str] | None = None,
    hosts: Sequence[Host] = (),
    warmup_tokens: int = 0,
) -> LocalStack:
    """Start the stack under `work_dir` (data/, logs/) and wait until every agent has joined;
    `env`: KVC_* settings of the Conductor beyond the secrets, which are generated. With
    `hosts`, the Conductor runs on the first and the agents on the others in turn (on the
    first too when it is the only one), each bound to its host's address; else all on
    loopback. Stops what it started and raises ChildFailed if a child dies or does not get
    ready."""
    api_key = secrets.token_urlsafe(SECRET_BYTES)
    admin_token = secrets.token_urlsafe(SECRET_BYTES)
    data_dir, logs = work_dir / "data", work_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    full_env = {
        **os.environ,
        "KVC_API_KEYS": f"local:{api_key}",
        "KVC_ADMIN_TOKEN": admin_token,
        "KVC_AGENT_SECRET": secrets.token_urlsafe(SECRET_BYTES),
        "KVC_DATA_DIR": str(data_dir),
        "KVC_API_KEY": api_key,
        "KVC_BLOCK_SIZE": str(block_size),
        **(env or {}),
    }
    # A port free here is free in a fresh namespace too (nothing else listens there).
    port, grpc_port = free_port("127.0.0.1"), free_port("127.0.0.1")
    address = hosts[0].address if hosts else "127.0.0.1"
    agent_hosts = list(hosts[1:] or hosts)
    base_url = f"http://{address}:{port}"
    stack = LocalStack(
        [], base_url, f"{address}:{grpc_port}", api_key, admin_token, full_env, logs, data_dir
    )
    try:
        conductor_args = [
            KVCENTRIC, "conductor", "--host", address, "--port", str(port),
            "--grpc-host", address, "--grpc-port", str(grpc_port), "--profile", profile,
        ]  # fmt: skip
        if hosts:
            conductor_args = hosts[0].command(conductor_args)
        spawn_into(
            stack.children,
            lambda: Child(
                "conductor", conductor_args, full_env, logs / "conductor.log", stdout_pipe=False
            ),
        )
        wait_for(
            "the conductor's /healthz", lambda: get_json(f"{base_url}/healthz"), stack.children
        )
        roles = agent_names(num_prefill, num_decode)
        for index, (role, name) in enumerate(roles):
            spawn_into(
                stack.children,
                lambda role=role, name=name, index=index: agent_child(
                    role,
                    name,
                    block_size=block_size,
                    conductor=stack.grpc_address,
                    env=full_env,
                    logs=logs,
                    torch_threads=shared_host_threads(len(roles)),
                    host=agent_hosts[index % len(agent_hosts)] if agent_hosts else None,
                    warmup_tokens=warmup_tokens,
                ),
            )

        def joined() -> bool:
            agents = get_json(f"{base_url}/v1/agents", api_key)
            return isinstance(agents, list) and len(agents) >= len(roles)

        wait_for(f"{len(roles)} agents to join", joined, stack.children)
    except BaseException:
        stack.stop()
        raise
    return stack
