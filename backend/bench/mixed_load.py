"""`kvcentric bench admission --load mixed`: how fast the Conductor refuses, and answers
`/healthz`, while it is also serving.

The stack is the admission benchmark's own (`bench_stack`: `kvcentric conductor`, SQLite,
tiny agents), left at its own SLOs. `concurrency` closed-loop clients each post a completion,
read the whole answer, think for `think_s` (drawn uniformly from half to one and a half
times it, so the clients do not move in lockstep) and post the next. The cluster serves
what admission lets in and refuses the rest with 429 at admission. Beside them a prober
sends `GET /healthz` every `HEALTH_PERIOD_S` on a connection of its own.

Reported: latency percentiles of the early rejections (the issue's bar: p99 <= 50 ms at
200 clients), of the served answers and of `/healthz`; counts; the cores each side used.

Why clients think: with none, 200 connections in a closed loop keep 200 requests queued at
the server whatever it does, and each waits 200 / (answers a second) on average (Little's
law). One Python process on a shared 2-core machine answers at most a few thousand
`/healthz` a second, so no server of this kind can answer 200 thinking-free clients within
50 ms (the all-rejected load, `--load rejected`, measures that saturation).
"""

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.bench.admission import (
    ENDPOINTS,
    HEALTH_PATH,
    TINY_PROFILE,
    CpuMeter,
    Phase,
    bench_stack,
    is_early_rejection_body,
    machine_info,
    num_prompt_tokens,
    process_rss_mib,
    request_bodies,
)
from backend.bench.health_probe import probe_health
from backend.cli.children import AGENT_NICE

HEALTH_PERIOD_S = 0.1
_REQUEST_TIMEOUT_S = 60.0


@dataclass
class MixedLoad:
    """What the clients and the prober measured."""

    rejected: Phase = field(default_factory=lambda: Phase(path="429 at admission"))
    served: Phase = field(default_factory=lambda: Phase(path="served (200)"))
    other: Phase = field(default_factory=lambda: Phase(path="other answers"))
    health: Phase = field(default_factory=lambda: Phase(path=HEALTH_PATH))
    duration_s: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)
    server_rss_mib: tuple[float, float] = (0.0, 0.0)


async def drive_mixed(
    base_url: str,
    *,
    path: str,
    bodies: list[bytes],
    headers: dict[str, str],
    concurrency: int,
    think_s: float,
    duration_s: float,
    warmup_s: float,
    server_pid: int | None = None,
    agent_pids: list[int] | None = None,
    seed: int = 0,
) -> MixedLoad:
    """The clients (aiohttp, which costs a fraction of httpx's CPU a request at hundreds of
    connections, so the clients measure the server rather than their own event loop) and
    the prober (a process of its own, for the same reason): `warmup_s` unrecorded, then
    `duration_s` recorded."""
    import multiprocessing

    import aiohttp

    load = MixedLoad()
    rng = random.Random(seed)
    record = False
    context = multiprocessing.get_context("spawn")
    pipe, prober_end = context.Pipe()
    prober = context.Process(target=probe_health, args=(prober_end,), daemon=True)
    prober.start()
    if not pipe.poll(60):  # it says "ready" once started
        raise RuntimeError("the /healthz prober did not start in 60 s")
    pipe.recv()
    begin = time.time()
    pipe.send((f"{base_url}{HEALTH_PATH}", HEALTH_PERIOD_S, begin + warmup_s, duration_s))
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=_REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(
        base_url=base_url, headers=headers, connector=connector, timeout=timeout
    ) as client:

        async def one_client(index: int, until: float) -> None:
            counter = index
            await asyncio.sleep(rng.uniform(0, think_s))  # spread the first requests
            while time.perf_counter() < until:
                counter += concurrency
                start = time.perf_counter()
                try:
                    async with client.post(path, data=bodies[counter % len(bodies)]) as response:
                        body = await response.read()
                    status = str(response.status)
                    early = status == "429" and is_early_rejection_body(body)
                except (aiohttp.ClientError, TimeoutError) as error:
                    status, early = f"error:{type(error).__name__}", False
                latency_s = time.perf_counter() - start
                if record:
                    served = load.served if status == "200" else load.other
                    phase = load.rejected if early else served
                    phase.latencies_s.append(latency_s)
                    phase.statuses[status] += 1
                await asyncio.sleep(rng.uniform(0.5 * think_s, 1.5 * think_s))

        async def measure() -> None:
            nonlocal record
            await asyncio.sleep(max(0.0, begin + warmup_s - time.time()))
            record = True
            rss_before = process_rss_mib(server_pid) if server_pid else 0.0
            meter = CpuMeter(server_pid, agent_pids or [])
            start = time.perf_counter()
            await asyncio.sleep(duration_s)
            record = False
            load.duration_s = time.perf_counter() - start
            load.cpu_s = meter.since()
            if server_pid:
                load.server_rss_mib = (rss_before, process_rss_mib(server_pid))

        until = time.perf_counter() + warmup_s + duration_s
        await asyncio.gather(measure(), *(one_client(i, until) for i in range(concurrency)))
    probed = await asyncio.to_thread(pipe.recv) if pipe.poll(30) else []
    prober.join(timeout=5)
    for status, seconds in probed:
        load.health.latencies_s.append(seconds)
        load.health.statuses[status] += 1
    for phase in (load.rejected, load.served, load.other, load.health):
        phase.duration_s = load.duration_s
        phase.num_requests = len(phase.latencies_s)
    load.rejected.num_rejected_early = load.rejected.num_requests
    return load


def run_mixed_bench(
    *,
    duration_s: float = 20.0,
    concurrency: int = 200,
    think_s: float = 1.0,
    num_prefill: int = 1,
    num_decode: int = 1,
    endpoint: str = "completions",
    prompt_tokens: int = 1024,
    max_tokens: int = 16,
    warmup_s: float = 3.0,
    log_level: str = "info",
    profile: str | None = TINY_PROFILE,
    keep_dir: Path | None = None,
    agent_cpus: str | None = None,
    agent_nice: int = AGENT_NICE,
    on_status: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Start the stack, run the mixed load, measure; the JSON report (see the module doc).
    `agent_cpus`, `agent_nice`: pin the agents to these CPUs, give them this nice value (see
    `bench_stack`)."""
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}")
    if think_s <= 0:
        raise ValueError(f"think_s must be positive (see the module doc), got {think_s}")
    from backend.cli.up_cmd import DEMO_LENGTH_SCALE, DEMO_SLO_HEADROOM, demo_slos
    from backend.traces import SHIPPED_TRACE

    bodies = request_bodies(endpoint, prompt_tokens, max_tokens)
    machine = machine_info()
    # The SLOs `kvcentric up` serves the demo with (the paper's rule on the tiny profile).
    ttft_slo_s, tbt_slo_s = demo_slos(SHIPPED_TRACE, DEMO_LENGTH_SCALE, DEMO_SLO_HEADROOM)
    with bench_stack(
        num_prefill=num_prefill,
        num_decode=num_decode,
        log_level=log_level,
        profile=profile,
        keep_dir=keep_dir,
        on_status=on_status,
        agent_cpus=agent_cpus,
        agent_nice=agent_nice,
        settings={"KVC_TTFT_SLO_S": f"{ttft_slo_s:.4f}", "KVC_TBT_SLO_S": f"{tbt_slo_s:.4f}"},
    ) as stack:
        on_status(
            f"SLOs as `kvcentric up` sets them: TTFT {ttft_slo_s * 1000:.0f} ms, "
            f"TBT {tbt_slo_s * 1000:.1f} ms"
        )
        on_status(
            f"mixed load: {concurrency} clients thinking ~{think_s:g} s, GET {HEALTH_PATH} every "
            f"{HEALTH_PERIOD_S:g} s; {warmup_s:g} s warm-up, {duration_s:g} s measured"
        )
        load = asyncio.run(
            drive_mixed(
                stack.base_url,
                path=ENDPOINTS[endpoint],
                bodies=bodies,
                headers=stack.user_headers,
                concurrency=concurrency,
                think_s=think_s,
                duration_s=duration_s,
                warmup_s=warmup_s,
                server_pid=stack.server_pid,
                agent_pids=stack.agent_pids,
            )
        )
    seconds = load.duration_s or 1.0
    return {
        "load": "mixed",
        "rejected_early": load.rejected.summary(),
        "served": load.served.summary(),
        "other_statuses": dict(load.other.statuses),
        "health": load.health.summary(),
        "cores_used": {name: round(cpu / seconds, 2) for name, cpu in load.cpu_s.items()},
        "server_rss_mib": [round(mib, 1) for mib in load.server_rss_mib],
        **stack.recorded,
        "endpoint": ENDPOINTS[endpoint],
        "concurrency": concurrency,
        "think_s": think_s,
        "agent_cpus": agent_cpus,
        "agent_nice": agent_nice,
        "ttft_slo_s": ttft_slo_s,
        "tbt_slo_s": tbt_slo_s,
        "duration_s": duration_s,
        "warmup_s": warmup_s,
        "num_prefill": num_prefill,
        "num_decode": num_decode,
        "prompt_tokens": num_prompt_tokens(bodies[0]),
        "max_tokens": max_tokens,
        "log_level": log_level,
        "cost_model": profile if profile is not None else "reference_70b",
        "machine": machine,
    }
