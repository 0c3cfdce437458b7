"""Builders of the policy's events and effects the persistence functions take."""

from backend.db.records import RequestOutcome
from backend.policy.effects import CachePlan, DispatchPrefill, FetchSpan, InstanceEstimate
from backend.policy.events import RequestArrived

BLOCK_SIZE = 512
BIG_KEY = 2**64 - 1  # xxh3_64 keys use all 64 bits: they must survive both databases
# A completed request's outcome with every measurement set.
COMPLETED = RequestOutcome(
    state="completed",
    finished_time_s=105.0,
    ttft_s=1.25,
    tbt_mean_s=0.05,
    tbt_p99_s=0.09,
    tbt_max_s=0.11,
    num_generated_tokens=32,
    num_reused_tokens=1024,
    num_transferred_tokens=512,
)


def arrival(
    request_id: str,
    now_s: float,
    block_keys: tuple[int, ...] = (11, 12),
    num_input_tokens: int | None = None,
    num_output_tokens: int = 32,
    ttft_slo_s: float | None = None,
) -> RequestArrived:
    if num_input_tokens is None:
        num_input_tokens = len(block_keys) * BLOCK_SIZE + 100
    return RequestArrived(
        now_s=now_s,
        request_id=request_id,
        block_keys=block_keys,
        num_input_tokens=num_input_tokens,
        num_output_tokens=num_output_tokens,
        ttft_slo_s=ttft_slo_s,
    )


def dispatch(
    request_id: str, instance_id: str = "p0", fetch_from: str | None = "p1"
) -> DispatchPrefill:
    fetch = FetchSpan(fetch_from, (21, 22, 23)) if fetch_from else None
    candidates = (
        InstanceEstimate(instance_id, 1, 0.5, 0.2, 1.0, 1.7, fetch is not None),
        InstanceEstimate("p9", 0, 0.0, 0.0, 2.5, 2.5, False),
    )
    return DispatchPrefill(
        request_id=request_id,
        instance_id=instance_id,
        decode_instance_id="d0",
        plan=CachePlan(
            local_keys=(11,), fetch=fetch, num_reused_tokens=2048, num_compute_tokens=100
        ),
        estimated_queue_s=0.5,
        estimated_transfer_s=0.2,
        estimated_prefill_s=1.0,
        estimated_ttft_s=1.7,
        candidates=candidates,
    )
