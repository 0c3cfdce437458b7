"""Prometheus metrics of the Conductor, each app with its own registry (never the global one,
so several apps and tests in one process never clash)."""

from backend.metrics.conductor import TBT_BUCKETS_S, TTFT_BUCKETS_S, ConductorMetrics

__all__ = ["TBT_BUCKETS_S", "TTFT_BUCKETS_S", "ConductorMetrics"]
