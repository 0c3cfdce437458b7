"""Benchmarks of the pure policy: block hashing speed and Conductor decisions per second.

Each benchmark returns a frozen result with a same-run baseline, so the figures recorded in
docs/benchmarks.md are ratios as well as absolute numbers; `kvcentric bench` prints them.
"""
