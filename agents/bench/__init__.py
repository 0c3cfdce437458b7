"""Benchmarks of the node agent's workers; each function returns a JSON-ready dict."""

from agents.bench.layerwise import layerwise_benchmark
from agents.bench.workers import decode_benchmark, prefix_reuse_benchmark

__all__ = ["decode_benchmark", "layerwise_benchmark", "prefix_reuse_benchmark"]
