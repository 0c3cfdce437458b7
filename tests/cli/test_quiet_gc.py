"""The long-running processes' garbage collection: what is alive at start frozen out of
the collector's sight, young collections less often (backend/cli/quiet_gc.py)."""

import gc

from backend.cli.quiet_gc import GC_YOUNG_THRESHOLD, quiet_garbage_collection


def test_what_lives_at_start_is_frozen_and_young_collections_are_rarer() -> None:
    threshold = gc.get_threshold()
    try:
        kept = [[index] for index in range(1000)]  # built before serving: lives on
        quiet_garbage_collection()
        assert gc.get_freeze_count() >= len(kept)
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, *threshold[1:])
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
