"""`kvcentric bench admission`: the admission path under overload, every request rejected early.

The benchmark starts a stack of its own, the way `kvcentric up` does (and with its helpers):
`kvcentric conductor` (uvicorn serving `create_app` over a `ConductorRuntime`, SQLite under
a temporary directory, the `tiny-cpu` cost-model profile) in its own process, then real
`kvcentric agent` processes with the `tiny` preset, and waits until they have joined.

Then it overloads the cluster the way an operator would see it: through `PUT /v1/config`
(admin token, versioned and audited) it sets the TTFT SLO to a tenth of the prefill time the
Conductor's own cost model predicts for the benchmark's prompt on an idle instance. No
prefill instance can meet that SLO, so admission refuses every request before any work is
dispatched: HTTP 429, reason `ttft_slo`, stage `admission`.

The load comes from this process: `concurrency` asyncio workers sharing one keep-alive
httpx client, each posting OpenAI completions (or native requests) back to back for
`duration_s` after a warm-up. Every response is classified; `num_rejected_early` counts the
429s whose body says stage `admission`, anything else goes to `other_statuses`. The same
client then drives `GET /healthz` (no auth, no work) for the same time: `rps_vs_health` is
the same-run ratio that stays comparable across machines. Each phase also reports the CPU
it cost, per request for the server and the client, and as `cores_used` by the server,
the agents, the client and `other` processes (busy time of the machine none of ours
explains): on a 2-core machine they all share the cores, and a one-process Conductor
cannot answer more than 1,000 / (server CPU ms per request) requests a second.

After the stack stops, the database is read back: every request sent must have its arrival
and its rejection recorded (`num_recorded_rejected_early`).
"""

import asyncio
import contextlib
import datetime
import json
import math
import os
import platform
import secrets
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from backend.cli.children import (
    AGENT_NICE,
    KVCENTRIC,
    SECRET_BYTES,
    Child,
    free_port,
    get_json,
    stop_stack,
    wait_for,
)
from backend.cli.conductor_cmd import cost_model
from backend.settings.profiles import profile_path

TINY_PROFILE = "tiny-cpu"  # the twin's built-in measured profile of the tiny agents
ENDPOINTS = {"completions": "/v1/completions", "native": "/v1/native/requests"}
HEALTH_PATH = "/healthz"
SLO_FRACTION = 0.1  # the TTFT SLO as a share of the idle prefill time the cost model predicts
_NUM_BODIES = 64  # distinct prompts, cycled through
_REQUEST_TIMEOUT_S = 30.0
# Words cut into tokens by the synthetic tokenizer (about 1.2 tokens a word).
_TEXT = (
    "the cluster serves each request from the prefill pool then streams tokens from decode "
    "while the cache keeps blocks of earlier prompts so reuse saves compute and time"
)
_WORDS = tuple(_TEXT.split(" "))


@dataclass
class Phase:
    """What one client phase measured."""

    path: str
    duration_s: float = 0.0
    num_requests: int = 0
    num_warmup_requests: int = 0
    num_rejected_early: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    latencies_s: list[float] = field(default_factory=list)
    cpu_s: dict[str, float] = field(default_factory=dict)  # CpuMeter.since()
    server_rss_mib: tuple[float, float] = (0.0, 0.0)  # at the start and the end
    # A client that reports percentiles, not each latency (wrk): quantile -> ms, and "max".
    reported_ms: dict[float, float] = field(default_factory=dict)

    @property
    def rps(self) -> float:
        return self.num_requests / self.duration_s if self.duration_s > 0 else 0.0

    def percentile_ms(self, q: float) -> float:
        """Nearest-rank percentile of the latencies, in milliseconds (as the client reported
        it, when it reports percentiles only)."""
        if not self.latencies_s:
            return self.reported_ms.get(q, 0.0)
        ordered = sorted(self.latencies_s)
        rank = min(len(ordered), max(1, math.ceil(q * len(ordered))))
        return ordered[rank - 1] * 1000.0

    def summary(self) -> dict[str, Any]:
        per_request = 1000.0 / self.num_requests if self.num_requests else 0.0
        seconds = self.duration_s or 1.0
        return {
            "path": self.path,
            "duration_s": round(self.duration_s, 3),
            "num_requests": self.num_requests,
            "rps": round(self.rps, 1),
            "p50_ms": round(self.percentile_ms(0.50), 3),
            "p90_ms": round(self.percentile_ms(0.90), 3),
            "p99_ms": round(self.percentile_ms(0.99), 3),
            "max_ms": round(
                max(self.latencies_s, default=self.reported_ms.get(1.0, 0.0) / 1000.0) * 1000.0, 3
            ),
            "statuses": dict(self.statuses),
            "server_cpu_ms_per_request": round(self.cpu_s.get("server", 0.0) * per_request, 3),
            "client_cpu_ms_per_request": round(self.cpu_s.get("client", 0.0) * per_request, 3),
            # Cores busy on average: ours, and the rest of the machine (other work on it).
            "cores_used": {name: round(cpu / seconds, 2) for name, cpu in self.cpu_s.items()},
            "server_rss_mib": [round(mib, 1) for mib in self.server_rss_mib],
        }


def prompt_text(num_words: int, variant: int) -> str:
    """A deterministic English-like prompt; `variant` changes its first words."""
    words = [f"request{variant}", "asks:"]
    words.extend(_WORDS[(variant + i) % len(_WORDS)] for i in range(num_words))
    return " ".join(words)


def request_bodies(endpoint: str, prompt_tokens: int, max_tokens: int) -> list[bytes]:
    """JSON bodies of prompts of about `prompt_tokens` tokens, built once (the client then
    only sends bytes)."""
    from backend.api.routes.serving import DEFAULT_MODEL, VOCAB_SIZE
    from backend.tokenizer import SyntheticTokenizer

    tokenizer = SyntheticTokenizer(VOCAB_SIZE)
    bodies = []
    for variant in range(_NUM_BODIES):
        low, high = 1, max(1, prompt_tokens)  # the most words whose tokens fit
        while low < high:
            middle = (low + high + 1) // 2
            if len(tokenizer.encode(prompt_text(middle, variant))) <= prompt_tokens:
                low = middle
            else:
                high = middle - 1
        text = prompt_text(low, variant)
        if endpoint == "native":
            body: dict[str, Any] = {"text": text, "max_tokens": max_tokens}
        else:
            body = {"model": DEFAULT_MODEL, "prompt": text, "max_tokens": max_tokens}
        bodies.append(json.dumps(body).encode())
    return bodies


def num_prompt_tokens(body: bytes) -> int:
    from backend.api.routes.serving import VOCAB_SIZE
    from backend.tokenizer import SyntheticTokenizer

    decoded = json.loads(body)
    return len(SyntheticTokenizer(VOCAB_SIZE).encode(decoded.get("prompt") or decoded["text"]))


def machine_info() -> dict[str, Any]:
    """Cores, CPU model, memory, Python and the load average, for docs/benchmarks.md."""
    cpu_model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return {
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": cpu_model,
        "memory_gib": round(memory / 2**30, 1),
        "python": platform.python_version(),
        "httpx": httpx.__version__,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` (all its threads), from /proc; 0 elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU seconds all cores have spent busy since boot (/proc/stat); 0 elsewhere."""
    try:
        with open("/proc/stat") as stat:
            ticks = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds since construction: the server, the agents, this client and the rest of
    the machine (`other`: busy time none of ours explains)."""

    def __init__(self, server_pid: int | None, agent_pids: Sequence[int]) -> None:
        self._server_pid = server_pid
        self._agent_pids = tuple(agent_pids)
        self._start = self._read()

    def _read(self) -> dict[str, float]:
        return {
            "server": process_cpu_s(self._server_pid) if self._server_pid else 0.0,
            "agents": sum(process_cpu_s(pid) for pid in self._agent_pids),
            "client": time.process_time(),
            "machine": machine_busy_s(),
        }

    def since(self) -> dict[str, float]:
        now = self._read()
        spent = {name: now[name] - self._start[name] for name in now}
        machine = spent.pop("machine")
        spent["other"] = max(0.0, machine - sum(spent.values()))
        return spent


def process_rss_mib(pid: int) -> float:
    """Resident memory of process `pid` in MiB, from /proc; 0 elsewhere."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def is_early_rejection(response: httpx.Response) -> bool:
    return response.status_code == 429 and is_early_rejection_body(response.content)


def is_early_rejection_body(body: bytes) -> bool:
    """A 429's body says it was refused at admission, with a reason."""
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return error.get("stage") == "admission" and bool(error.get("reason"))


async def drive(
    base_url: str,
    *,
    method: str,
    path: str,
    bodies: list[bytes] | None,
    headers: dict[str, str],
    concurrency: int,
    duration_s: float,
    warmup_s: float,
    server_pid: int | None = None,
    agent_pids: Sequence[int] = (),
) -> Phase:
    """`concurrency` workers sending back to back on one keep-alive client: `warmup_s`
    unrecorded, then `duration_s` recorded (requests in flight at the end still count)."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    phase = Phase(path=path)
    counter = 0
    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, limits=limits, timeout=_REQUEST_TIMEOUT_S
    ) as client:

        async def send() -> tuple[str, bool]:
            nonlocal counter
            try:
                if bodies is None:
                    response = await client.request(method, path)
                else:
                    counter += 1
                    body = bodies[counter % len(bodies)]
                    response = await client.request(method, path, content=body)
                response.read()
            except httpx.HTTPError as error:
                return f"error:{type(error).__name__}", False
            return str(response.status_code), is_early_rejection(response)

        async def worker(until: float, record: bool) -> None:
            while (start := time.perf_counter()) < until:
                status, early = await send()
                if not record:
                    phase.num_warmup_requests += 1
                    continue
                phase.latencies_s.append(time.perf_counter() - start)
                if early:
                    phase.num_rejected_early += 1
                else:
                    phase.statuses[status] += 1

        if warmup_s > 0:
            until = time.perf_counter() + warmup_s
            await asyncio.gather(*(worker(until, False) for _ in range(concurrency)))
        server_rss = process_rss_mib(server_pid) if server_pid else 0.0
        meter = CpuMeter(server_pid, agent_pids)
        start = time.perf_counter()
        await asyncio.gather(*(worker(start + duration_s, True) for _ in range(concurrency)))
        phase.duration_s = time.perf_counter() - start
        phase.cpu_s = meter.since()
        if server_pid:
            phase.server_rss_mib = (server_rss, process_rss_mib(server_pid))
    phase.num_requests = len(phase.latencies_s)
    return phase


CLIENTS = ("httpx", "wrk")
# What the Lua script's done() prints: requests, non-2xx answers, socket errors, the
# latency percentiles and maximum (microseconds) and the run's duration (microseconds).
_WRK_DONE = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("KVC-WRK %d %d %d %d %d %d %d %d\\n", summary.requests, e.status,
    e.connect + e.read + e.write + e.timeout, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, summary.duration))
end
"""


def wrk_script(method: str, headers: dict[str, str], bodies: list[bytes] | None) -> str:
    """The Lua script that makes wrk send what `drive` sends (bodies in turn)."""
    lines = [f'wrk.method = "{method}"']
    lines += [f'wrk.headers["{name}"] = "{value}"' for name, value in headers.items()]
    if bodies:
        quoted = ", ".join(f"[==[{body.decode()}]==]" for body in bodies)
        lines += [
            f"local bodies = {{{quoted}}}",
            "local i = 0",
            "request = function()",
            "  i = i + 1",
            "  return wrk.format(nil, nil, nil, bodies[(i % #bodies) + 1])",
            "end",
        ]
    return "\n".join(lines) + _WRK_DONE


def drive_wrk(
    base_url: str,
    *,
    method: str,
    path: str,
    bodies: list[bytes] | None,
    headers: dict[str, str],
    concurrency: int,
    duration_s: float,
    warmup_s: float,
    script_dir: Path,
    server_pid: int | None = None,
    agent_pids: Sequence[int] = (),
) -> Phase:
    """As `drive`, with wrk (C, one thread, epoll) as the client: it takes a fraction of the
    CPU an asyncio client needs per request, so hundreds of connections measure the server
    rather than the client. Its answers are not read one by one: requests not answered 2xx
    are `statuses["non-2xx"]`, and the database says whether each was rejected early."""
    script = script_dir / f"wrk-{method.lower()}.lua"
    script.write_text(wrk_script(method, headers, bodies))

    def run(seconds: float) -> list[int]:
        command = [
            "wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(seconds))}s",
            "--timeout", f"{int(_REQUEST_TIMEOUT_S)}s", "-s", str(script), f"{base_url}{path}",
        ]  # fmt: skip
        output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        line = next(line for line in output.splitlines() if line.startswith("KVC-WRK "))
        return [int(value) for value in line.split()[1:]]

    phase = Phase(path=path)
    if warmup_s > 0:
        phase.num_warmup_requests = run(warmup_s)[0]
    server_rss = process_rss_mib(server_pid) if server_pid else 0.0
    meter = CpuMeter(server_pid, agent_pids)
    requests, non_2xx, socket_errors, p50, p90, p99, longest, duration_us = run(duration_s)
    phase.cpu_s = meter.since()
    phase.duration_s = duration_us / 1e6
    phase.num_requests = requests
    if non_2xx:
        phase.statuses["non-2xx"] = non_2xx
    if requests - non_2xx - socket_errors > 0:
        phase.statuses["2xx"] = requests - non_2xx - socket_errors
    if socket_errors:
        phase.statuses["error:socket"] = socket_errors
    phase.reported_ms = {0.50: p50 / 1000, 0.90: p90 / 1000, 0.99: p99 / 1000, 1.0: longest / 1000}
    if server_pid:
        phase.server_rss_mib = (server_rss, process_rss_mib(server_pid))
    return phase


def _recorded_outcomes(database_url: str) -> dict[str, int]:
    """Rows of the stopped Conductor's database: requests, and those rejected at admission."""
    from sqlalchemy import func, select

    from backend.db.models import RequestRow
    from backend.db.session import create_db_engine

    engine = create_db_engine(database_url)
    try:
        with engine.connect() as connection:
            total = connection.scalar(select(func.count()).select_from(RequestRow))
            rejected = connection.scalar(
                select(func.count())
                .select_from(RequestRow)
                .where(RequestRow.outcome == "rejected", RequestRow.outcome_stage == "admission")
            )
    finally:
        engine.dispose()
    return {"num_recorded_requests": int(total or 0), "num_recorded_rejected_early": int(rejected)}


@dataclass
class BenchStack:
    """A running stack of the benchmark's own: where to reach it and what to measure."""

    base_url: str
    api_key: str
    admin_token: str
    data_dir: Path
    database_url: str
    server_pid: int
    agent_pids: list[int]
    children: list[Child]
    # Read back from the database once the stack stopped (`_recorded_outcomes`).
    recorded: dict[str, int] = field(default_factory=dict)

    @property
    def user_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}", "Content-Type": "application/json"}


@contextlib.contextmanager
def bench_stack(
    *,
    num_prefill: int,
    num_decode: int,
    log_level: str,
    profile: str | None,
    keep_dir: Path | None,
    on_status: Callable[[str], None],
    settings: dict[str, str] | None = None,
    agent_cpus: str | None = None,
    agent_nice: int = AGENT_NICE,
) -> Iterator[BenchStack]:
    """Start `kvcentric conductor` (SQLite in a scratch directory) and tiny agents as
    `kvcentric up` does, wait until they joined; stop them on exit and read back what the
    database recorded. `settings`: more KVC_* variables for the Conductor and agents;
    `agent_cpus`: a CPU list (taskset's, e.g. "1") the agents are pinned to, leaving the
    other cores to the Conductor and the clients, as if the agents ran on hosts of their
    own; `agent_nice`: the agents' nice value (the Conductor keeps 0; see
    `backend.cli.children.AGENT_NICE`). Raises ChildFailed when the stack does not start."""
    if agent_cpus and shutil.which("taskset") is None:
        raise ValueError("--agent-cpus needs taskset on the PATH (Debian: util-linux)")
    with tempfile.TemporaryDirectory(prefix="kvc-bench-admission-") as scratch:
        data_dir = keep_dir or Path(scratch)
        logs = data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        api_key = secrets.token_urlsafe(SECRET_BYTES)
        admin_token = secrets.token_urlsafe(SECRET_BYTES)
        from backend.settings import ConductorSettings

        block_size = str(ConductorSettings.model_fields["block_size"].default)
        database_url = f"sqlite:///{(data_dir / 'kvcentric.db').resolve()}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVC_")}
        env.update(
            {
                "KVC_API_KEYS": f"bench:{api_key}",
                "KVC_ADMIN_TOKEN": admin_token,
                "KVC_AGENT_SECRET": secrets.token_urlsafe(SECRET_BYTES),
                "KVC_DATA_DIR": str(data_dir),
                "KVC_DATABASE_URL": database_url,
                "KVC_BLOCK_SIZE": block_size,
                "KVC_LOG_LEVEL": log_level,
                **(settings or {}),
            }
        )
        port, grpc_port = free_port("127.0.0.1"), free_port("127.0.0.1")
        base_url = f"http://127.0.0.1:{port}"
        children: list[Child] = []
        try:
            on_status(f"starting the conductor on {base_url} (SQLite under {data_dir})")
            conductor_args = [
                KVCENTRIC, "conductor", "--host", "127.0.0.1", "--port", str(port),
                "--grpc-host", "127.0.0.1", "--grpc-port", str(grpc_port),
            ]  # fmt: skip
            if profile is not None:
                conductor_args += ["--profile", str(profile)]
            conductor = Child(
                "conductor", conductor_args, env, logs / "conductor.log", stdout_pipe=False
            )
            children.append(conductor)
            wait_for("the conductor's /healthz", lambda: get_json(f"{base_url}/healthz"), children)
            roles = ["prefill"] * num_prefill + ["decode"] * num_decode
            on_status(f"starting {num_prefill} prefill + {num_decode} decode tiny agents")
            for index, role in enumerate(roles):
                pinned = ["taskset", "-c", agent_cpus] if agent_cpus else []
                agent_args = [
                    *pinned, KVCENTRIC, "agent", "--role", role, "--listen", "127.0.0.1:0",
                    "--data-listen", "127.0.0.1:0", "--preset", "tiny",
                    "--instance-id", f"{role}-{index}", "--block-size", block_size,
                    "--conductor", f"127.0.0.1:{grpc_port}",
                ]  # fmt: skip
                if profile is not None:
                    agent_args += ["--profile", str(profile_path(profile))]
                log = logs / f"agent-{role}-{index}.log"
                name = f"agent {role}-{index}"
                children.append(
                    Child(name, agent_args, env, log, stdout_pipe=False, nice=agent_nice)
                )

            def joined() -> bool:
                agents = get_json(f"{base_url}/v1/agents", api_key)
                return isinstance(agents, list) and len(agents) >= len(roles)

            wait_for(f"{len(roles)} agents to join", joined, children)
            stack = BenchStack(
                base_url=base_url,
                api_key=api_key,
                admin_token=admin_token,
                data_dir=data_dir,
                database_url=database_url,
                server_pid=conductor.process.pid,
                agent_pids=[child.process.pid for child in children[1:]],
                children=children,
            )
            yield stack
            for child in children:
                child.check_alive()
        finally:
            stop_stack(None, children)
        stack.recorded = _recorded_outcomes(database_url)


def run_admission_bench(
    *,
    duration_s: float = 10.0,
    concurrency: int = 4,
    num_prefill: int = 1,
    num_decode: int = 1,
    endpoint: str = "completions",
    prompt_tokens: int = 1024,
    max_tokens: int = 16,
    warmup_s: float = 1.0,
    log_level: str = "info",
    profile: str | None = TINY_PROFILE,
    keep_dir: Path | None = None,
    client: str = "httpx",
    on_status: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Start the stack, overload it, measure; the JSON report (see the module doc).

    Raises ChildFailed (from `backend.cli.children`) when the stack does not start.
    """
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}")
    if client not in CLIENTS:
        raise ValueError(f"client must be one of {', '.join(CLIENTS)}, got {client!r}")
    if client == "wrk" and shutil.which("wrk") is None:
        raise ValueError("--client wrk needs wrk on the PATH (Debian: apt-get install wrk)")
    cost = cost_model(profile)
    bodies = request_bodies(endpoint, prompt_tokens, max_tokens)
    num_tokens = num_prompt_tokens(bodies[0])
    idle_prefill_s = cost.prefill_time_s(num_tokens, 0)
    ttft_slo_s = idle_prefill_s * SLO_FRACTION
    machine = machine_info()
    with bench_stack(
        num_prefill=num_prefill,
        num_decode=num_decode,
        log_level=log_level,
        profile=profile,
        keep_dir=keep_dir,
        on_status=on_status,
    ) as stack:
        overload = _overload(stack.base_url, stack.admin_token, ttft_slo_s)
        on_status(
            f"overload: TTFT SLO {ttft_slo_s * 1000:.2f} ms, a tenth of the "
            f"{idle_prefill_s * 1000:.1f} ms the cost model predicts for a "
            f"{num_tokens}-token prefill on an idle instance"
        )
        on_status(f"measuring {ENDPOINTS[endpoint]} for {duration_s:g} s x {concurrency}")

        def measure(method: str, path: str, **kwargs: Any) -> Phase:
            common = {
                "method": method,
                "path": path,
                "concurrency": concurrency,
                "duration_s": duration_s,
                "server_pid": stack.server_pid,
                "agent_pids": stack.agent_pids,
                **kwargs,
            }
            if client == "wrk":
                return drive_wrk(stack.base_url, script_dir=stack.data_dir, **common)
            return asyncio.run(drive(stack.base_url, **common))

        measured = measure(
            "POST", ENDPOINTS[endpoint], bodies=bodies, headers=stack.user_headers,
            warmup_s=warmup_s,
        )  # fmt: skip
        on_status(f"baseline: GET {HEALTH_PATH} for {duration_s:g} s x {concurrency}")
        health = measure("GET", HEALTH_PATH, bodies=None, headers={}, warmup_s=min(warmup_s, 0.5))
    recorded = stack.recorded
    if (
        client == "wrk"
        and set(measured.statuses) == {"non-2xx"}
        and recorded["num_recorded_rejected_early"] == recorded["num_recorded_requests"]
    ):  # wrk does not read the answers: the database says every one was rejected early
        measured.num_rejected_early = measured.statuses.pop("non-2xx")
    return _report(
        measured=measured,
        health=health,
        recorded=recorded,
        overload=overload,
        settings={
            "endpoint": ENDPOINTS[endpoint],
            "concurrency": concurrency,
            "duration_s": duration_s,
            "warmup_s": warmup_s,
            "num_prefill": num_prefill,
            "num_decode": num_decode,
            "prompt_tokens": num_tokens,
            "max_tokens": max_tokens,
            "log_level": log_level,
            "client": client,
            "database": "sqlite",
            "cost_model": profile if profile is not None else "reference_70b",
        },
        slo={"ttft_slo_s": ttft_slo_s, "idle_prefill_s": idle_prefill_s},
        machine=machine,
    )


def _overload(base_url: str, admin_token: str, ttft_slo_s: float) -> dict[str, Any]:
    """Set the TTFT SLO through the configuration API (as an operator would); returns the
    configuration version in force."""
    headers = {"Authorization": f"Bearer {admin_token}"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=_REQUEST_TIMEOUT_S) as client:
        response = client.put("/v1/config", json={"config": {"ttft_slo_s": ttft_slo_s}})
        response.raise_for_status()
        view = response.json()
    return {"config_version": view["version"], "config": view["config"]}


def _report(
    *,
    measured: Phase,
    health: Phase,
    recorded: dict[str, int],
    overload: dict[str, Any],
    settings: dict[str, Any],
    slo: dict[str, float],
    machine: dict[str, Any],
) -> dict[str, Any]:
    other = dict(measured.statuses)
    summary = measured.summary()
    config = overload["config"]
    return {
        "rps": summary["rps"],
        "p50_ms": summary["p50_ms"],
        "p90_ms": summary["p90_ms"],
        "p99_ms": summary["p99_ms"],
        "max_ms": summary["max_ms"],
        "num_requests": measured.num_requests,
        "num_rejected_early": measured.num_rejected_early,
        "other_statuses": other,
        "num_warmup_requests": measured.num_warmup_requests,
        "all_rejected_early": measured.num_requests > 0 and not other,
        "server_cpu_ms_per_request": summary["server_cpu_ms_per_request"],
        "client_cpu_ms_per_request": summary["client_cpu_ms_per_request"],
        "cores_used": summary["cores_used"],
        "server_rss_mib": summary["server_rss_mib"],
        "health": health.summary(),
        "rps_vs_health": round(measured.rps / health.rps, 3) if health.rps else 0.0,
        **recorded,
        "overload": (
            f"TTFT SLO {slo['ttft_slo_s'] * 1000:.3f} ms (PUT /v1/config, version "
            f"{overload['config_version']}): {SLO_FRACTION:g} x the "
            f"{slo['idle_prefill_s'] * 1000:.2f} ms prefill the cost model predicts for "
            f"a {settings['prompt_tokens']}-token prompt on an idle instance; "
            f"rejection policy {config['rejection_policy']}"
        ),
        "ttft_slo_s": slo["ttft_slo_s"],
        "idle_prefill_s": slo["idle_prefill_s"],
        **settings,
        "machine": machine,
    }
