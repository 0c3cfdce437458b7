"""The data-plane benchmark on a small batch: every figure is there and consistent.

Speed is not asserted here; the figures belong in docs/benchmarks.md.
"""

from agents.transport.bench import run_transport_bench
from tests.agents.transport.conftest import MOONCAKE_MISSING


def test_bench_reports_ours_the_socket_baseline_and_their_ratio() -> None:
    result = run_transport_bench(num_blocks=8, block_bytes=64 << 10, repeats=2)

    assert result.total_bytes == 8 * (64 << 10)
    assert result.ours_gbps > 0 and result.socket_gbps > 0
    assert result.ratio == result.ours_gbps / result.socket_gbps
    assert result.ours_gbps == result.total_bytes * 8 / result.ours_s / 1e9
    if MOONCAKE_MISSING is None:
        assert result.mooncake_gbps is not None and result.mooncake_gbps > 0
        assert result.mooncake_skipped is None
    else:
        assert result.mooncake_gbps is None
        assert result.mooncake_skipped == MOONCAKE_MISSING
