"""Recorder: what happened to every request of a twin run, and the pools' load over time.

One RequestRecord per request, ending in exactly one terminal outcome; a second terminal
outcome for the same request is a bug and raises.
"""

from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestRecord:
    id: str
    arrival_s: float
    input_tokens: int
    output_tokens: int
    outcome: str | None = None  # "completed" | "rejected" | "failed"
    reason: str | None = None
    stage: str | None = None
    prefill_instance: str | None = None
    decode_instance: str | None = None
    first_token_s: float | None = None
    estimated_ttft_s: float | None = None
    tbt_mean_s: float | None = None
    tbt_max_s: float | None = None
    reused_tokens: int = 0
    reachable_tokens: int = 0
    transferred_tokens: int = 0
    replicated_blocks: int = 0
    computed_tokens: int = 0
    prefill_compute_s: float = 0.0
    finish_s: float | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s


@dataclass(slots=True)
class Recorder:
    records: dict[str, RequestRecord] = field(default_factory=dict)
    num_terminal: int = 0
    num_replicated_blocks: int = 0
    load_samples_t_s: list[float] = field(default_factory=list)
    prefill_load_samples: list[float] = field(default_factory=list)
    decode_load_samples: list[float] = field(default_factory=list)

    def end(self, request_id: str, outcome: str, now_s: float, **details: object) -> None:
        record = self.records[request_id]
        if record.outcome is not None:
            raise RuntimeError(
                f"request {request_id} ended twice: {record.outcome}, then {outcome}"
            )
        record.outcome = outcome
        record.finish_s = now_s
        for name, value in details.items():
            setattr(record, name, value)
        self.num_terminal += 1

    def sample_loads(self, now_s: float, prefill_load: float, decode_load: float) -> None:
        self.load_samples_t_s.append(now_s)
        self.prefill_load_samples.append(prefill_load)
        self.decode_load_samples.append(decode_load)
