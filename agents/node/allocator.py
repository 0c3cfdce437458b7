"""The agent's memory allocator, set for steady compute times from the first request on.

A prefill allocates its activations afresh each time (tens of MB for a long prompt), from
whichever gRPC thread serves the call. With glibc's defaults those large blocks come from
mmap and go back to the OS when freed (the threshold for that only grows as larger blocks
are freed), and each thread that allocates under contention gets an arena of its own, which
grows, and is trimmed back, on its own. So every block of a young agent is fresh memory,
paid for in page faults on the computing thread: measured at speed 8 on a 2-CPU host, a
new agent's prefills took 2x the CPU time per token for their first ~5 seconds (21 ms per
100 tokens against 10.5 later, the same prompts), across the ~20 threads that served
them. That start-up slowness is what a short calibration window measures, and what the
twin then replays for the whole window (docs/fidelity.md).

Fixed thresholds (so the allocator keeps what it got) and one arena (the compute of a
prefill agent runs one call at a time; a decode agent steps on one thread) bring an agent
to its steady speed within its first second of serving. Other C libraries than glibc lack
`mallopt` and are left as they are.
"""

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

# glibc's <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

# Blocks below this come from the heap and stay there (glibc's dynamic ceiling is 32 MiB);
# free memory at the heap's top is given back only past TRIM_THRESHOLD_BYTES.
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 512 * 1024 * 1024
ARENA_MAX = 1


def steady_allocator() -> bool:
    """Set the process's allocator as above; True when glibc took every setting. Call it
    before the agent starts its threads (arenas already handed out stay)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 (glibc only: musl and macOS lack it)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    settings = (
        (M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
        (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
        (M_ARENA_MAX, ARENA_MAX),
    )
    taken = all(mallopt(option, value) == 1 for option, value in settings)
    if not taken:
        logger.warning("glibc refused an allocator setting; compute times may settle slowly")
    return taken
