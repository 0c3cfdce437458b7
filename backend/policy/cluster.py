"""The core's view of each instance's work: prefill queues, decode batches, link backlogs.

Mutable state owned by the ConductorCore and changed only through its event handlers.
Running sums are kept so that every quantity Algorithm 1 and admission need is O(1) or
O(requests that change state), never a scan of the cluster.
"""

from dataclasses import dataclass, field


@dataclass(slots=True)
class RunningPrefill:
    started_s: float
    predicted_s: float


@dataclass(slots=True)
class PrefillState:
    """One prefill instance: its queue in predicted seconds and its outgoing link."""

    instance_id: str
    queued_s: dict[str, float] = field(default_factory=dict)
    running: dict[str, RunningPrefill] = field(default_factory=dict)
    total_queued_s: float = 0.0
    link_busy_until_s: float = 0.0
    draining: bool = False  # takes no new requests

    def queue_s(self, now_s: float) -> float:
        """T_queue: predicted seconds of queued prefills plus what running ones have left."""
        remaining = 0.0
        for run in self.running.values():
            left = run.started_s + run.predicted_s - now_s
            if left > 0:
                remaining += left
        return self.total_queued_s + remaining

    def link_backlog_s(self, now_s: float) -> float:
        """Seconds of transfers already committed on this instance's outgoing link."""
        return max(0.0, self.link_busy_until_s - now_s)

    def enqueue(self, request_id: str, predicted_s: float) -> None:
        self.queued_s[request_id] = predicted_s
        self.total_queued_s += predicted_s

    def start(self, request_id: str, now_s: float) -> None:
        predicted_s = self.dequeue(request_id)
        if predicted_s is not None:
            self.running[request_id] = RunningPrefill(started_s=now_s, predicted_s=predicted_s)

    def dequeue(self, request_id: str) -> float | None:
        predicted_s = self.queued_s.pop(request_id, None)
        if predicted_s is not None:
            self.total_queued_s = self.total_queued_s - predicted_s if self.queued_s else 0.0
        return predicted_s

    def finish(self, request_id: str) -> None:
        if self.running.pop(request_id, None) is None:
            self.dequeue(request_id)

    def request_ids(self) -> list[str]:
        return [*self.queued_s, *self.running]


@dataclass(slots=True)
class DecodingRequest:
    context_tokens: int
    started_s: float


@dataclass(slots=True)
class IncomingRequest:
    """A request assigned to a decode instance whose prefill has not finished yet."""

    context_tokens: int
    ready_s: float


@dataclass(slots=True)
class DecodeState:
    """One decode instance: its running batch and the requests headed its way."""

    instance_id: str
    kv_capacity_tokens: int | None = None
    # Insertion order is start order, which early-predicted relies on.
    decoding: dict[str, DecodingRequest] = field(default_factory=dict)
    decoding_context_tokens: int = 0
    incoming: dict[str, IncomingRequest] = field(default_factory=dict)
    incoming_context_tokens: int = 0
    draining: bool = False  # takes no new requests

    def add_incoming(self, request_id: str, context_tokens: int, ready_s: float) -> None:
        self.incoming[request_id] = IncomingRequest(context_tokens, ready_s)
        self.incoming_context_tokens += context_tokens

    def drop_incoming(self, request_id: str) -> IncomingRequest | None:
        incoming = self.incoming.pop(request_id, None)
        if incoming is not None:
            self.incoming_context_tokens -= incoming.context_tokens
        return incoming

    def start(self, request_id: str, context_tokens: int, now_s: float) -> None:
        self.drop_incoming(request_id)
        self.decoding[request_id] = DecodingRequest(context_tokens, now_s)
        self.decoding_context_tokens += context_tokens

    def grow(self, request_id: str, context_tokens: int) -> None:
        running = self.decoding.get(request_id)
        if running is not None and context_tokens > running.context_tokens:
            self.decoding_context_tokens += context_tokens - running.context_tokens
            running.context_tokens = context_tokens

    def finish(self, request_id: str) -> DecodingRequest | None:
        running = self.decoding.pop(request_id, None)
        if running is not None:
            self.decoding_context_tokens -= running.context_tokens
        else:
            self.drop_incoming(request_id)
        return running

    def request_ids(self) -> list[str]:
        return [*self.incoming, *self.decoding]
