"""BlockHits: how often each KV block was reused by a prefill, for the console's hot spots.

A hit is a block of a request's prompt prefix that its prefill did not recompute (loaded
from its own shard or fetched from another instance). Counts are kept for the hottest
blocks only: when more than `max_blocks` are tracked, the colder half is dropped.
"""

from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple


class HotBlock(NamedTuple):
    key: int
    depth: int  # position of the block in its prompt (0 = first block)
    hits: int


class BlockHits:
    """Hit counts per block key, bounded; see the module docstring."""

    def __init__(self, *, max_blocks: int = 65_536) -> None:
        self.max_blocks = max_blocks
        self._hits: Counter[int] = Counter()
        self._depth: dict[int, int] = {}

    def record(self, keys: Sequence[int], num_reused_blocks: int) -> None:
        """One prefill reused the first `num_reused_blocks` blocks of `keys`."""
        for depth, key in enumerate(keys[:num_reused_blocks]):
            self._hits[key] += 1
            self._depth[key] = depth
        if len(self._hits) > self.max_blocks:
            keep = self._hits.most_common(self.max_blocks // 2)
            self._hits = Counter(dict(keep))
            self._depth = {key: self._depth[key] for key, _ in keep}

    def top(self, limit: int) -> list[HotBlock]:
        """The `limit` most reused blocks, hottest first (ties: shallower first)."""
        ranked = sorted(self._hits.items(), key=lambda kv: (-kv[1], self._depth[kv[0]], kv[0]))
        return [HotBlock(key, self._depth[key], hits) for key, hits in ranked[:limit]]

    def __len__(self) -> int:
        return len(self._hits)
