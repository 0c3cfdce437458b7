"""Torch thread settings for the worker benchmarks (set per benchmark, restored after)."""

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def torch_threads(num_threads: int) -> Iterator[int]:
    """Run the block with `num_threads` torch threads, then restore the previous setting."""
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield num_threads
    finally:
        torch.set_num_threads(previous)


def compute_threads(spare_cores: int = 0) -> int:
    """Torch threads that leave `spare_cores` cores to I/O threads (at least one thread)."""
    return max(1, (os.cpu_count() or 1) - spare_cores)
