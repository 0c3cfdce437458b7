"""Keep CPython's cyclic garbage collector out of a long-running process's tail latency.

A full collection walks every live object, holding the GIL, and its cost grows with the
heap: everything imported and built at start (hundreds of thousands of objects) and, in a
client, every result recorded so far. Measured (docs/benchmarks.md, docs/fidelity.md):

- the Conductor (`kvcentric bench admission --load mixed`): full collections paused its
  event loop for 300-475 ms every ten seconds or so, the whole p99 of a 429;
- the replay client of `twin validate` at speed 8: full collections of 120-146 ms, two in
  a two-minute window and none in its warm-up, each holding a core at the client's higher
  CPU priority while the agents computed beside it (the agents run at nice 10), so the
  measured window was slowed by the load generator, not by the cluster it measures.

Everything alive once the process is set up is moved out of the collector's sight
(`gc.freeze`: it lives as long as the process), and young collections run less often, so
short-lived objects die young instead of being promoted into the old generations.
"""

import gc

# Allocations between two young collections (CPython's default is 700). A 429 allocates a
# few thousand objects; at hundreds a second the default collects the young generation
# tens of times a second and promotes short-lived request objects into the old ones.
GC_YOUNG_THRESHOLD = 20_000


def quiet_garbage_collection() -> None:
    """Freeze what is alive now and collect the young generation less often; call it once
    the process is built (its imports, its app, its plan), before it serves."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)
