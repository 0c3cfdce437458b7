"""Measured links: how fast KV actually moves from one instance to another.

The cost model's `LinkModel` is one bandwidth for every pair of instances, from a profile.
Across hosts links differ (another rack, a congested switch port, a throttled namespace),
and Algorithm 1's transfer branch should see that: fetching a prefix from behind a slow
link can cost more than recomputing it. Every finished fetch is a measurement (bytes moved,
seconds taken, source and destination); per ordered pair the estimate is an exponentially
weighted mean of seconds per byte beyond the link's fixed latency, the quantity a transfer
time is linear in. A pair never measured uses the profile's bandwidth.
"""

from dataclasses import dataclass, field

# Weight of the newest measurement: a link that slows down is believed within a few fetches.
SMOOTHING = 0.3
# Fetches smaller than this say more about per-call overheads than about bandwidth.
MIN_MEASURED_BYTES = 16 * 1024


@dataclass(slots=True)
class LinkEstimates:
    """Per (source, destination) pair, the believed seconds per byte of a fetch."""

    smoothing: float = SMOOTHING
    min_bytes: int = MIN_MEASURED_BYTES
    _seconds_per_byte: dict[tuple[str, str], float] = field(default_factory=dict)
    _count: dict[tuple[str, str], int] = field(default_factory=dict)

    def observe(
        self, source: str, destination: str, num_bytes: int, seconds: float, latency_s: float
    ) -> bool:
        """Take one fetch into the pair's estimate; False when too small or malformed to count."""
        if num_bytes < self.min_bytes or not seconds >= 0 or source == destination:
            return False
        sample = max(seconds - latency_s, 0.0) / num_bytes
        pair = (source, destination)
        old = self._seconds_per_byte.get(pair)
        self._seconds_per_byte[pair] = (
            sample if old is None else old + self.smoothing * (sample - old)
        )
        self._count[pair] = self._count.get(pair, 0) + 1
        return True

    def seconds_per_byte(self, source: str, destination: str) -> float | None:
        """The pair's believed seconds per byte, or None when never measured."""
        return self._seconds_per_byte.get((source, destination))

    def forget(self, instance_id: str) -> None:
        """Drop every pair with `instance_id` at either end (it left; it may come back
        elsewhere)."""
        for pair in [p for p in self._seconds_per_byte if instance_id in p]:
            del self._seconds_per_byte[pair]
            del self._count[pair]

    def snapshot(self) -> list[dict[str, object]]:
        """Every measured pair: source, destination, bandwidth (bytes/s; None when its
        fetches took no time beyond the latency) and how many fetches it rests on."""
        rows: list[dict[str, object]] = []
        for (source, destination), spb in sorted(self._seconds_per_byte.items()):
            rows.append(
                {
                    "source": source,
                    "destination": destination,
                    "bandwidth_bytes_per_s": 1.0 / spb if spb > 0 else None,
                    "num_measurements": self._count[(source, destination)],
                }
            )
        return rows
