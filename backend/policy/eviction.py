"""Eviction order of a pool shard: prefix-aware LRU (the pools' default), the paper's plain
LRU, LFU or length-aware; pinned blocks are never chosen.

Each order is told of inserts, accesses and removals with the event time `now_s`, and
`pop_victims` removes and returns the next blocks to evict, in one pass. Plain LRU evicts
the least recently touched block; a prompt's blocks are touched front to back, so it takes
a prefix's head first and orphans the blocks behind it (unreachable without the head).
Prefix-aware LRU breaks ties of recency by depth, deepest first: every use of a block also
uses the blocks before it, so a head is always at least as recent as its tail and a prefix
shrinks from its tail (as SGLang evicts radix-tree leaves and vLLM frees a request's blocks
in reverse). LFU breaks frequency ties by least recent access; length-aware evicts the
deepest block first (a deep block is reusable only while every block before it is cached),
then the least recent.
"""

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable
from typing import Final, Protocol

IsPinned = Callable[[int], bool]


class EvictionOrder(Protocol):
    def on_insert(self, key: int, now_s: float, depth: int) -> None: ...
    def on_access(self, key: int, now_s: float) -> None: ...
    def on_remove(self, key: int) -> None: ...
    def pop_victims(self, num_blocks: int, is_pinned: IsPinned) -> list[int]: ...


class LruOrder:
    """Least recently used first."""

    def __init__(self) -> None:
        self._order: OrderedDict[int, None] = OrderedDict()

    def on_insert(self, key: int, now_s: float, depth: int) -> None:
        self._order[key] = None
        self._order.move_to_end(key)

    def on_access(self, key: int, now_s: float) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def on_remove(self, key: int) -> None:
        self._order.pop(key, None)

    def pop_victims(self, num_blocks: int, is_pinned: IsPinned) -> list[int]:
        victims = []
        if num_blocks > 0:
            for key in self._order:
                if not is_pinned(key):
                    victims.append(key)
                    if len(victims) == num_blocks:
                        break
        for key in victims:
            del self._order[key]
        return victims


class _HeapOrder:
    """A lazy-deletion heap: stale entries are skipped when they surface."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, float, int, int]] = []
        self._current: dict[int, int] = {}  # key -> sequence number of its live entry
        self._sequence = itertools.count()

    def _rank(self, key: int, now_s: float) -> tuple[float, float]:
        raise NotImplementedError

    def _push(self, key: int, now_s: float) -> None:
        sequence = next(self._sequence)
        self._current[key] = sequence
        primary, secondary = self._rank(key, now_s)
        heapq.heappush(self._heap, (primary, secondary, sequence, key))
        if len(self._heap) > 4 * len(self._current) + 64:
            self._heap = [entry for entry in self._heap if self._current.get(entry[3]) == entry[2]]
            heapq.heapify(self._heap)

    def on_remove(self, key: int) -> None:
        self._current.pop(key, None)

    def pop_victims(self, num_blocks: int, is_pinned: IsPinned) -> list[int]:
        # Pinned entries are set aside and pushed back once, after the pass.
        skipped = []
        victims: list[int] = []
        while self._heap and len(victims) < num_blocks:
            entry = heapq.heappop(self._heap)
            key = entry[3]
            if self._current.get(key) != entry[2]:
                continue  # stale
            if is_pinned(key):
                skipped.append(entry)
                continue
            del self._current[key]
            victims.append(key)
        for entry in skipped:
            heapq.heappush(self._heap, entry)
        return victims


class _DepthOrder(_HeapOrder):
    """A heap order whose rank reads each block's depth in its prompt."""

    def __init__(self) -> None:
        super().__init__()
        self._depth: dict[int, int] = {}

    def on_insert(self, key: int, now_s: float, depth: int) -> None:
        self._depth[key] = depth
        self._push(key, now_s)

    def on_access(self, key: int, now_s: float) -> None:
        if key in self._current:
            self._push(key, now_s)

    def on_remove(self, key: int) -> None:
        super().on_remove(key)
        self._depth.pop(key, None)

    def pop_victims(self, num_blocks: int, is_pinned: IsPinned) -> list[int]:
        victims = super().pop_victims(num_blocks, is_pinned)
        for victim in victims:
            del self._depth[victim]
        return victims


class PrefixLruOrder(_DepthOrder):
    """Least recently used first; among blocks used at the same time, the deepest first."""

    def _rank(self, key: int, now_s: float) -> tuple[float, float]:
        return now_s, float(-self._depth[key])


class LfuOrder(_HeapOrder):
    """Least frequently used first; ties go to the least recently used."""

    def __init__(self) -> None:
        super().__init__()
        self._hits: dict[int, int] = {}

    def _rank(self, key: int, now_s: float) -> tuple[float, float]:
        return float(self._hits[key]), now_s

    def on_insert(self, key: int, now_s: float, depth: int) -> None:
        self._hits[key] = 1
        self._push(key, now_s)

    def on_access(self, key: int, now_s: float) -> None:
        if key in self._current:
            self._hits[key] += 1
            self._push(key, now_s)

    def on_remove(self, key: int) -> None:
        super().on_remove(key)
        self._hits.pop(key, None)

    def pop_victims(self, num_blocks: int, is_pinned: IsPinned) -> list[int]:
        victims = super().pop_victims(num_blocks, is_pinned)
        for victim in victims:
            del self._hits[victim]
        return victims


class LengthAwareOrder(_DepthOrder):
    """Deepest block (largest position in its prompt) first; ties to the least recent."""

    def _rank(self, key: int, now_s: float) -> tuple[float, float]:
        return float(-self._depth[key]), now_s


# The pools' default (agents, the twin, the Conductor's settings): prefixes shrink from the tail.
DEFAULT_EVICTION_POLICY: Final = "prefix-lru"

_ORDERS: dict[str, Callable[[], EvictionOrder]] = {
    "prefix-lru": PrefixLruOrder,
    "lru": LruOrder,
    "lfu": LfuOrder,
    "length-aware": LengthAwareOrder,
}


def make_eviction_order(policy: str) -> EvictionOrder:
    """A fresh eviction order for `policy` ("prefix-lru", "lru", "lfu" or "length-aware")."""
    try:
        return _ORDERS[policy]()
    except KeyError:
        raise ValueError(
            f"unknown eviction policy {policy!r}; choose one of {', '.join(_ORDERS)}"
        ) from None
