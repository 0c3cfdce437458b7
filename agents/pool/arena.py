"""SlotArena: the DRAM tier's bytes, fixed-size slots in one preallocated buffer.

Storing a block is one memcpy into a free slot; reading it is a memoryview of the slot, no
copy. The arena does no locking: the shard hands out slots under its lock and touches a
slot's bytes only while the slot's block is pinned or not yet published.
"""


class SlotArena:
    """`num_slots` slots of `slot_bytes` each, allocated once."""

    def __init__(self, num_slots: int, slot_bytes: int) -> None:
        if num_slots < 0 or slot_bytes <= 0:
            raise ValueError(
                f"need num_slots >= 0 and slot_bytes > 0, got {num_slots}, {slot_bytes}"
            )
        self.slot_bytes = slot_bytes
        self.num_slots = num_slots
        self._buffer = bytearray(num_slots * slot_bytes)
        self._view = memoryview(self._buffer)
        self._free = list(range(num_slots - 1, -1, -1))  # pop() hands out slot 0 first

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self) -> int:
        if not self._free:
            raise RuntimeError("arena has no free slot (more blocks than DRAM capacity)")
        return self._free.pop()

    def free(self, slot: int) -> None:
        self._free.append(slot)

    def view(self, slot: int) -> memoryview:
        """The slot's bytes, writable (the shard hands callers read-only views)."""
        start = slot * self.slot_bytes
        return self._view[start : start + self.slot_bytes]

    def write(self, slot: int, data: memoryview) -> None:
        self.view(slot)[:] = data
