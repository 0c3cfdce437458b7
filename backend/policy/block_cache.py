"""BlockCache: the bookkeeping of one pool shard tier (keys, capacity, pins, eviction order).

It holds no bytes: agents keep the KV tensors beside it, the twin and `trace cache-sim`
use it alone. Pinned blocks (in use by in-flight requests, reference counted) are never
evicted; an insert that finds only pinned blocks to evict is refused.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from backend.policy.eviction import DEFAULT_EVICTION_POLICY, IsPinned, make_eviction_order


@dataclass(frozen=True, slots=True)
class Inserted:
    """What `insert_blocks` did: blocks newly stored, blocks left out for lack of room, and
    the keys evicted to make room."""

    num_stored: int
    num_refused: int
    evicted: list[int]


class BlockCache:
    """Keys of at most `capacity_blocks` blocks (None: unlimited), evicted by `policy`."""

    def __init__(self, capacity_blocks: int | None, policy: str = DEFAULT_EVICTION_POLICY) -> None:
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
        evicted = self._make_room(1, self.is_pinned)
        if not self.has_room(1):
            return False, evicted
        self._keys.add(key)
        self._order.on_insert(key, now_s, depth)
        return True, evicted

    def insert_blocks(self, keys: Sequence[int], now_s: float, first_depth: int = 0) -> Inserted:
        """Add a prompt's consecutive blocks (depths from `first_depth`), never evicting any of
        them to make room for another. Keys already held are left as they are.

        When the unpinned rest of the cache
        cannot make room, the deepest new blocks are the ones left out: a block is only
        reusable behind its whole prefix.
        """
        batch = set(keys)
        new = [(depth, key) for depth, key in enumerate(keys, first_depth) if key not in self._keys]
        pins = self._pins
        evicted = self._make_room(len(new), lambda key: key in pins or key in batch)
        num_absent = len(new)
        if self.capacity_blocks is not None:
            new = new[: max(0, self.capacity_blocks - len(self._keys))]
        for depth, key in new:
            self._keys.add(key)
            self._order.on_insert(key, now_s, depth)
        return Inserted(num_stored=len(new), num_refused=num_absent - len(new), evicted=evicted)

    def has_room(self, num_blocks: int) -> bool:
        return self.capacity_blocks is None or len(self._keys) + num_blocks <= self.capacity_blocks

    def _make_room(self, num_blocks: int, is_protected: IsPinned) -> list[int]:
        """Evict (in policy order, skipping protected keys) until `num_blocks` more fit."""
        if self.capacity_blocks is None:
            return []
        excess = len(self._keys) + num_blocks - self.capacity_blocks
        if excess <= 0:
            return []
        evicted = self._order.pop_victims(excess, is_protected)
        self._keys.difference_update(evicted)
        return evicted

    def remove(self, key: int) -> bool:
        """Drop `key` unless it is pinned; returns whether it was dropped."""
        if key not in self._keys or key in self._pins:
            return False
        self._keys.discard(key)
        self._order.on_remove(key)
        return True

    def evict(self, num_blocks: int) -> list[int]:
        """Evict up to `num_blocks` unpinned blocks in policy order."""
        evicted = self._order.pop_victims(num_blocks, self.is_pinned)
        self._keys.difference_update(evicted)
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
