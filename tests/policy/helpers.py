"""Builders shared by the policy tests: cost models and a core with instances joined."""

from backend.policy import (
    AgentJoined,
    ConductorCore,
    CostModel,
    DecodeFit,
    LinkModel,
    PolicyConfig,
    PrefillFit,
)

LLAMA2_70B_KV_BYTES_PER_TOKEN = 327_680


def linear_cost(
    *,
    prefill_tokens_per_s: float = 2000.0,
    decode: DecodeFit | None = None,
    bandwidth_bytes_per_s: float = 100e9,
) -> CostModel:
    """The worked example's cost model: linear prefill, 100 GB/s links, no latency."""
    return CostModel(
        prefill=PrefillFit(fixed_s=0.0, per_token_s=1.0 / prefill_tokens_per_s),
        decode=decode or DecodeFit(fixed_s=0.0, per_request_s=0.01, per_context_token_s=0.0),
        link=LinkModel(bandwidth_bytes_per_s=bandwidth_bytes_per_s, latency_s=0.0),
        kv_bytes_per_token=LLAMA2_70B_KV_BYTES_PER_TOKEN,
    )


def make_core(
    config: PolicyConfig,
    cost: CostModel,
    *,
    prefill: tuple[str, ...] = ("P1",),
    decode: tuple[str, ...] = ("D1",),
) -> ConductorCore:
    core = ConductorCore(config, cost)
    for instance_id in prefill:
        core.handle(AgentJoined(0.0, instance_id, "prefill"))
    for instance_id in decode:
        core.handle(AgentJoined(0.0, instance_id, "decode"))
    return core
