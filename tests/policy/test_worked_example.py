"""A worked example of Algorithm 1, checked number by number through the core."""

import pytest

from backend.policy import (
    DispatchPrefill,
    KvStored,
    PolicyConfig,
    Replicate,
    RequestArrived,
)
from tests.policy.helpers import make_core

from .helpers import linear_cost

BLOCK_SIZE = 16
REQUEST_TOKENS = 32_768
KEYS = tuple(range(1, REQUEST_TOKENS // BLOCK_SIZE + 1))  # 2,048 full blocks
CACHED_TOKENS = {"P1": 19_200, "P2": 9_600, "P3": 0, "P4": 12_800}
QUEUE_S = {"P1": 2.0, "P2": 0.5, "P3": 0.5, "P4": 0.5}

# The worked example's table: estimated TTFT of P1..P4 in seconds (F = transfer branch, from P1),
# the chosen instance and the blocks it fetches.
TABLE = """
threshold  P1       P2        P3        P4        chosen  fetched
1.0        8.78400  7.31546F  7.34691F  7.30497F  P4      400
1.5        8.78400  7.31546F  7.34691F  7.30497F  P4      400
2.5        8.78400  12.08400  7.34691F  10.48400  P3      1200
inf        8.78400  12.08400  16.88400  10.48400  P1      0
"""


def parse_table() -> dict[float, tuple[dict[str, tuple[float, bool]], str, int]]:
    rows = {}
    for line in TABLE.strip().splitlines()[1:]:
        threshold, *ttfts, chosen, fetched = line.split()
        estimates = {
            f"P{n}": (float(cell.rstrip("F")), cell.endswith("F"))
            for n, cell in enumerate(ttfts, start=1)
        }
        rows[float(threshold)] = (estimates, chosen, int(fetched))
    return rows


EXPECTED = parse_table()


def build_example_core(threshold: float):
    config = PolicyConfig(
        block_size=BLOCK_SIZE,
        kvcache_balancing_threshold=threshold,
        rejection_policy="baseline",
        ttft_slo_s=10.0,
        tbt_slo_s=1.0,
    )
    core = make_core(config, linear_cost(), prefill=("P1", "P2", "P3", "P4"), decode=("D1", "D2"))
    for instance_id, tokens in CACHED_TOKENS.items():
        if tokens:
            core.handle(KvStored(0.0, instance_id, KEYS[: tokens // BLOCK_SIZE]))
    for instance_id, queue_s in QUEUE_S.items():
        core.prefill[instance_id].enqueue(f"queued-on-{instance_id}", queue_s)
    # Decode loads: TBT ratios 0.6 on D1 and 0.3 on D2 (0.01 s per request, SLO 1 s).
    for instance_id, batch in (("D1", 60), ("D2", 30)):
        for n in range(batch):
            core.decode[instance_id].start(f"{instance_id}-{n}", 0, 0.0)
    return core


@pytest.mark.parametrize("threshold", list(EXPECTED))
def test_worked_example(threshold: float) -> None:
    expected_ttfts, expected_choice, expected_fetch_blocks = EXPECTED[threshold]
    core = build_example_core(threshold)
    assert core.decode_loads() == pytest.approx({"D1": 0.6, "D2": 0.3})

    effects = core.handle(RequestArrived(1.0e-9, "r", KEYS, REQUEST_TOKENS, 100))

    dispatch = effects[0]
    assert isinstance(dispatch, DispatchPrefill), effects  # admitted under a 10 s TTFT SLO
    estimates = {e.instance_id: (round(e.ttft_s, 5), e.uses_transfer) for e in dispatch.candidates}
    assert estimates == expected_ttfts
    assert dispatch.instance_id == expected_choice
    assert dispatch.decode_instance_id == "D2"
    plan = dispatch.plan
    local_blocks = CACHED_TOKENS[expected_choice] // BLOCK_SIZE
    assert plan.local_keys == KEYS[:local_blocks]
    if expected_fetch_blocks:
        assert plan.fetch is not None and plan.fetch.source_instance_id == "P1"
        assert len(plan.fetch.keys) == expected_fetch_blocks
        assert plan.fetch.keys == KEYS[local_blocks : local_blocks + expected_fetch_blocks]
        assert plan.num_reused_tokens == 19_200
        replicate = effects[1]
        assert isinstance(replicate, Replicate)
        assert (replicate.source_instance_id, replicate.target_instance_id) == (
            "P1",
            expected_choice,
        )
        assert replicate.keys == plan.fetch.keys
    else:
        assert plan.fetch is None and len(effects) == 1
        assert plan.num_reused_tokens == 19_200
    assert plan.num_compute_tokens == REQUEST_TOKENS - 19_200


def test_cache_aware_scheduler_is_the_algorithm_at_threshold_inf() -> None:
    core = build_example_core(1.0)
    core.reconfigure(
        PolicyConfig(
            block_size=BLOCK_SIZE,
            prefill_scheduler="cache-aware",
            kvcache_balancing_threshold=1.0,
            rejection_policy="baseline",
            ttft_slo_s=10.0,
            tbt_slo_s=1.0,
        )
    )
    (dispatch,) = core.handle(RequestArrived(1.0e-9, "r", KEYS, REQUEST_TOKENS, 100))
    assert dispatch.instance_id == "P1"
    assert dispatch.plan.fetch is None
