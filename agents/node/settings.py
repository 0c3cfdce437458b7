"""AgentSettings: what one agent process is told at start, validated on construction."""

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agents.model.registry import resolve_model
from agents.transport import TRANSPORT_KINDS, parse_address
from backend.settings.conductor import MIN_SECRET_CHARS

AgentRole = Literal["prefill", "decode"]


@dataclass(frozen=True, slots=True)
class AgentSettings:
    role: AgentRole
    listen: str  # gRPC control address, "host:port" (port 0 picks one)
    data_listen: str  # data-plane (transport) address
    secret: str
    preset: str = "tiny"  # the model: a preset, a real model's name or a path (registry)
    block_size: int = 64
    instance_id: str | None = None  # default: derived from the control address
    conductor: str | None = None  # "host:port" of the Conductor to join; None: no heartbeats
    heartbeat_interval_s: float = 1.0  # unless the Conductor's JoinReply names one
    max_backlog_events: int = 100_000  # unacknowledged KV events kept for the Conductor
    dram_bytes: int = 256 << 20
    ssd_dir: Path | None = None
    ssd_bytes: int = 0
    transport: str = "tcp"
    seed: int = 0
    profile: Path | None = None  # a cost-model profile (JSON) for predicted TBT
    tbt_slo_s: float | None = None  # enables the local TBT check on decode arrival
    max_batch_size: int = 64
    # Torch's intra-op threads; None: torch's default (every core). Agents that share a
    # host should split its cores: oversubscribed, each one's threads wait on the others'.
    torch_threads: int | None = None
    drain_timeout_s: float = 30.0  # after SIGTERM, how long in-flight calls may finish
    # A prefill agent computes prompts of 64, 128, ... up to this many tokens once before it
    # serves, so its first requests run at its steady speed (agents/node/allocator.py); 0: none.
    warmup_tokens: int = 0

    def __post_init__(self) -> None:
        if self.role not in ("prefill", "decode"):
            raise ValueError(f"role must be 'prefill' or 'decode', got {self.role!r}")
        resolve_model(self.preset)  # ValueError naming the presets and real models
        if self.warmup_tokens < 0:
            raise ValueError(f"warm-up tokens must be >= 0, got {self.warmup_tokens}")
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ValueError(f"torch threads must be at least 1, got {self.torch_threads}")
        parse_address(self.listen)
        parse_address(self.data_listen)
        if len(self.secret) < MIN_SECRET_CHARS:
            raise ValueError(
                f"the shared secret (--secret, KVC_AGENT_SECRET) must be at least "
                f"{MIN_SECRET_CHARS} characters, as the Conductor's, got {len(self.secret)}"
            )
        if self.block_size <= 0:
            raise ValueError(f"block size must be positive, got {self.block_size}")
        if self.transport not in TRANSPORT_KINDS:
            raise ValueError(f"transport must be one of {TRANSPORT_KINDS}, got {self.transport!r}")
        if self.dram_bytes < 0 or self.ssd_bytes < 0:
            raise ValueError("capacities must be >= 0 bytes")
        if self.conductor is not None:
            parse_address(self.conductor)
        if not self.heartbeat_interval_s > 0:
            raise ValueError(f"heartbeat interval must be > 0 s, got {self.heartbeat_interval_s}")
        if self.drain_timeout_s < 0:
            raise ValueError(f"drain timeout must be >= 0 s, got {self.drain_timeout_s}")
        if self.max_backlog_events < 1:
            raise ValueError(f"max backlog events must be >= 1, got {self.max_backlog_events}")
        if self.tbt_slo_s is not None and self.profile is None:
            raise ValueError("the local TBT check (--tbt-slo) needs a cost-model --profile")
