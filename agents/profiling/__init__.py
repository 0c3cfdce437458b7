"""Profiling: measure a model preset's workers, pool tiers and link into a timing profile."""

from agents.profiling.grid import DEFAULT_GRID, QUICK_GRID, ProfileGrid
from agents.profiling.profile import run_profile, write_profile

__all__ = ["DEFAULT_GRID", "QUICK_GRID", "ProfileGrid", "run_profile", "write_profile"]
