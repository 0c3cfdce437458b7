"""One replayed request's result (a JSONL line) and the summary over all of them."""

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

Status = Literal["completed", "rejected", "failed", "http_error"]


@dataclass(frozen=True, slots=True)
class GapSummary:
    """Client-side gaps between consecutive tokens of one request, in seconds."""

    mean_s: float
    p90_s: float
    max_s: float


@dataclass(slots=True)
class RequestResult:
    """How one sent request ended, measured from the client; one line of the results file."""

    line: int
    sent_s: float
    status: Status
    id: str | None = None
    num_tokens: int = 0
    max_tokens: int = 0
    ttft_s: float | None = None
    tbt: GapSummary | None = None
    reason: str | None = None
    stage: str | None = None
    retry_after_s: float | None = None
    message: str | None = None
    http_status: int | None = None
    tbt_gaps_s: list[float] = field(default_factory=list, repr=False)

    def to_record(self) -> dict[str, object]:
        """The JSON object of the results file (the raw gaps stay out: only their summary)."""
        record = asdict(self)
        del record["tbt_gaps_s"]
        return {key: value for key, value in record.items() if value is not None}


def summarize_gaps(gaps_s: Sequence[float]) -> GapSummary | None:
    if not gaps_s:
        return None
    return GapSummary(
        mean_s=sum(gaps_s) / len(gaps_s), p90_s=percentile(gaps_s, 90), max_s=max(gaps_s)
    )


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True, slots=True)
class ReplaySummary:
    """Counts by status, TTFT and TBT percentiles (s) and the achieved rates (req/s)."""

    num_requests: int
    counts: dict[str, int]
    ttft_s: dict[str, float]
    tbt_s: dict[str, float]
    duration_s: float
    sent_per_s: float
    completed_per_s: float


def summarize(results: Sequence[RequestResult], duration_s: float) -> ReplaySummary:
    """Summary of a replay that took `duration_s` from its start to its last result."""
    counts = Counter(result.status for result in results)
    ttfts = [result.ttft_s for result in results if result.ttft_s is not None]
    gaps = [gap for result in results for gap in result.tbt_gaps_s]
    span_s = max(duration_s, 1e-9)
    return ReplaySummary(
        num_requests=len(results),
        counts=dict(sorted(counts.items())),
        ttft_s=_percentiles(ttfts),
        tbt_s=_percentiles(gaps),
        duration_s=duration_s,
        sent_per_s=len(results) / span_s,
        completed_per_s=counts["completed"] / span_s,
    )


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    return {f"p{q}": percentile(values, q) for q in (50, 90, 99)} | {"max": max(values)}
