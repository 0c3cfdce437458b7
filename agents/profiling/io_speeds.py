"""Pool tier and link speeds: per-block store/load times and the TCP transport's figures.

Tiers come from agents.pool.bench.bench_pool on blocks of the profiled model; the link from
agents.transport.bench.run_transport_bench between two processes on this machine, once
with a batch of large blocks (bandwidth) and once with a single small block (latency).
"""

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agents.pool.bench import bench_pool
from agents.transport.bench import run_transport_bench

_LINK_BLOCK_BYTES = 1 << 20
_LATENCY_BLOCK_BYTES = 4096
_LATENCY_REPEATS = 20


def measure_tiers(block_bytes: int, *, num_blocks: int, ssd_dir: Path | None) -> dict[str, Any]:
    """bench_pool's per-block microseconds plus the read speeds the profile's `storage` needs.

    A DRAM read is the shard's zero-copy load with its checksum check; an SSD read comes from
    the device with the page cache dropped first, promotion off.
    """
    figures: dict[str, Any] = bench_pool(block_bytes, num_blocks=num_blocks, ssd_root=ssd_dir)
    figures["dram_read_bytes_per_s"] = block_bytes / (figures["dram_load_us_per_block"] * 1e-6)
    figures["ssd_read_bytes_per_s"] = block_bytes / (figures["ssd_load_us_per_block"] * 1e-6)
    figures["ssd_dir"] = str(ssd_dir) if ssd_dir is not None else None
    return figures


def measure_link(*, num_blocks: int, repeats: int) -> dict[str, Any]:
    """Bandwidth of a batch of 1 MiB blocks and latency of a one-block 4 KiB fetch.

    Latency is the small fetch's median time less its bytes at the measured bandwidth.
    """
    with _stderr_held_back():
        batch = run_transport_bench(num_blocks, _LINK_BLOCK_BYTES, repeats)
        small = run_transport_bench(1, _LATENCY_BLOCK_BYTES, _LATENCY_REPEATS)
    bandwidth = batch.total_bytes / batch.ours_s
    latency = max(small.ours_s - small.total_bytes / bandwidth, 0.0)
    return {
        "bandwidth_bytes_per_s": bandwidth,
        "latency_s": latency,
        "bandwidth_run": asdict(batch),
        "latency_run": asdict(small),
    }


@contextmanager
def _stderr_held_back() -> Iterator[None]:
    """Point file descriptor 2 at a temporary file while the link is measured.

    Mooncake's C++ engine (run beside ours when installed) logs INFO lines to the raw
    descriptor, in this process and the serving one, which inherits it; they would tear the
    progress bar. What was held back is replayed if the measurement fails.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            held.seek(0)
            sys.stderr.write(held.read().decode(errors="replace"))
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
