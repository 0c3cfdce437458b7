"""BlockCache: the bookkeeping of one pool shard tier (keys, capacity, pins, eviction order).

It holds no bytes: agents keep the KV tensors beside it, the twin and `trace cache-sim`
use it alone. Pinned blocks (in use by in-flight requests, reference counted) are never
evicted; an insert that finds only pinned blocks to evict is refused.
"""

from collections.abc import Iterable, Sequence

from backend.policy.eviction import make_eviction_order


class BlockCache:
    """Keys of at most `capacity_blocks` blocks (None: unlimited), evicted by `policy`."""

    def __init__(self, capacity_blocks: int | None, policy: str = "lru") -> None:
        if capacity_blocks is not None and capacity_blocks < 0:
            raise ValueError(f"capacity_blocks must be >= 0, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self.policy = policy
        self._order = make_eviction_order(policy)
        self._keys: set[int] = set()
        self._pins: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def is_pinned(self, key: int) -> bool:
        return key in self._pins

    def match_prefix(self, keys: Sequence[int], now_s: float) -> int:
        """Leading `keys` held here; each matched block counts as an access at `now_s`."""
        matched = 0
        for key in keys:
            if key not in self._keys:
                break
            self._order.on_access(key, now_s)
            matched += 1
        return matched

    def touch(self, key: int, now_s: float) -> None:
        if key in self._keys:
            self._order.on_access(key, now_s)

    def insert(self, key: int, now_s: float, depth: int) -> tuple[bool, list[int]]:
        """Add `key` (the block at position `depth` of its prompt), evicting as needed.

        Returns (stored, evicted keys). An existing key is only touched.
        """
        if key in self._keys:
            self._order.on_access(key, now_s)
            return True, []
        evicted: list[int] = []
        if self.capacity_blocks is not None:
            while len(self._keys) >= self.capacity_blocks:
                victim = self._order.pop_victim(self.is_pinned)
                if victim is None:
                    return False, evicted
                self._keys.discard(victim)
                evicted.append(victim)
        self._keys.add(key)
        self._order.on_insert(key, now_s, depth)
        return True, evicted

    def remove(self, key: int) -> bool:
        """Drop `key` unless it is pinned; returns whether it was dropped."""
        if key not in self._keys or key in self._pins:
            return False
        self._keys.discard(key)
        self._order.on_remove(key)
        return True

    def evict(self, num_blocks: int) -> list[int]:
        """Evict up to `num_blocks` unpinned blocks in policy order."""
        evicted = []
        for _ in range(num_blocks):
            victim = self._order.pop_victim(self.is_pinned)
            if victim is None:
                break
            self._keys.discard(victim)
            evicted.append(victim)
        return evicted

    def pin(self, keys: Iterable[int]) -> None:
        for key in keys:
            self._pins[key] = self._pins.get(key, 0) + 1

    def unpin(self, keys: Iterable[int]) -> None:
        for key in keys:
            count = self._pins.get(key, 0)
            if count <= 1:
                self._pins.pop(key, None)
            else:
                self._pins[key] = count - 1
