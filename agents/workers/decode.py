"""DecodeWorker: continuous batching at iteration level, with the TBT check on arrival.

Each `step()` admits waiting requests into the running batch, runs one token for every
running request (linear layers batched, attention per request over its own KV cache) and
retires requests that reached `max_tokens`. A request joining mid-stream produces the same
tokens it would alone. The arrival check is backend.policy's `check_decode_arrival`, the
same code the twin runs, with the SLO and step model each request was dispatched with; a
rejection is reported with its reason, stage "decode".
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F

from agents.model.kv_blocks import PagedKv
from agents.model.model import LlamaModel
from agents.workers.decode_cache import RequestKvCache
from agents.workers.sampling import (
    GREEDY,
    SamplingParams,
    TokenLogprob,
    sample,
    token_logprob,
)
from backend.policy.decode_load import check_decode_arrival
from backend.policy.effects import ArrivalCheck


@dataclass(frozen=True, slots=True)
class DecodeRequest:
    """A prefilled request: its prompt KV, the first token (sampled from the prefill's
    logits, counted as output 1), how many output tokens it may have in all, and the check
    to run on its arrival (None: admit it unchecked)."""

    request_id: str
    kv: PagedKv
    first_token: int
    max_tokens: int
    sampling: SamplingParams = GREEDY
    arrival_check: ArrivalCheck | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")


@dataclass(frozen=True, slots=True)
class DecodeOutcome:
    """The terminal state of a request on this worker."""

    request_id: str
    status: Literal["completed", "rejected", "cancelled"]
    output_tokens: tuple[int, ...] = ()
    reason: str | None = None
    stage: Literal["decode"] | None = None


@dataclass(slots=True)
class _Running:
    request: DecodeRequest
    cache: RequestKvCache
    generator: torch.Generator | None
    output_tokens: list[int] = field(default_factory=list)


# request id, token, and its log-probability when the request asked for them (never for the
# first token: the prefill sampled it, and reported its own).
TokenCallback = Callable[[str, int, TokenLogprob | None], None]
FinishCallback = Callable[[DecodeOutcome], None]


class DecodeWorker:
    """Decodes many requests at once; tokens go out through `on_token` as they are made."""

    def __init__(
        self,
        model: LlamaModel,
        *,
        kv_capacity_tokens: int | None = None,
        max_batch_size: int = 64,
        on_token: TokenCallback | None = None,
        on_finish: FinishCallback | None = None,
        stop_token_ids: frozenset[int] = frozenset(),
    ) -> None:
        """`stop_token_ids`: the model's end-of-sequence tokens; a request that makes one ends
        there (the token included) unless its sampling says `ignore_eos`. Dummy models have
        none: their requests always run to max_tokens."""
        if max_batch_size <= 0:
            raise ValueError(f"max_batch_size must be positive, got {max_batch_size}")
        self.model = model
        self.kv_capacity_tokens = kv_capacity_tokens
        self.max_batch_size = max_batch_size
        self.on_token = on_token
        self.on_finish = on_finish
        self.stop_token_ids = stop_token_ids
        self._waiting: list[DecodeRequest] = []
        self._running: dict[str, _Running] = {}

    # -- load --------------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        """Requests running or admitted to join at the next step."""
        return len(self._running) + len(self._waiting)

    @property
    def context_tokens(self) -> int:
        running = sum(state.cache.num_tokens for state in self._running.values())
        return running + sum(request.kv.num_tokens for request in self._waiting)

    @property
    def is_idle(self) -> bool:
        return not self._running and not self._waiting

    # -- arrival -----------------------------------------------------------------------
    def submit(self, request: DecodeRequest) -> str | None:
        """Check the TBT SLO and admit `request`, or reject it: returns the reason or None."""
        known = {r.request_id for r in self._waiting} | self._running.keys()
        if request.request_id in known:
            raise ValueError(f"request {request.request_id!r} is already on this worker")
        if request.kv.blocks[0].shape[0] != self.model.config.num_layers:
            raise ValueError("the request's KV has a different number of layers than the model")
        if request.arrival_check is not None:
            reason = check_decode_arrival(
                request.arrival_check,
                batch_size=self.batch_size,
                context_tokens=self.context_tokens,
                new_context_tokens=request.kv.num_tokens,
                kv_capacity_tokens=self.kv_capacity_tokens,
            )
            if reason is not None:
                self._finish(DecodeOutcome(request.request_id, "rejected", (), reason, "decode"))
                return reason
        self._waiting.append(request)
        return None

    def cancel(self, request_id: str, reason: str) -> bool:
        """Drop a waiting or running request (its slot is free for the next step) and end it
        `cancelled` with `reason`; False when it is not on this worker."""
        for index, waiting in enumerate(self._waiting):
            if waiting.request_id == request_id:
                del self._waiting[index]
                self._finish(DecodeOutcome(request_id, "cancelled", (), reason, "decode"))
                return True
        state = self._running.pop(request_id, None)
        if state is None:
            return False
        outputs = tuple(state.output_tokens)
        self._finish(DecodeOutcome(request_id, "cancelled", outputs, reason, "decode"))
        return True

    # -- the iteration -----------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> int:
        """Admit waiting requests, then decode one token for each running one; returns how
        many tokens were produced (first tokens of joiners included)."""
        produced = self._join()
        if not self._running:
            return produced
        model = self.model
        config = model.config
        # A decode query sees every cached key, so a KV head's group of query heads can ride
        # in SDPA's query-length dimension: [kv_heads, group, D] against [kv_heads, L, D], no
        # mask and no GQA expansion (the same numbers, fewer and faster kernel calls).
        group = config.num_heads // config.num_kv_heads
        batch = list(self._running.values())
        inputs = torch.tensor([state.output_tokens[-1] for state in batch])
        positions = [state.cache.num_tokens for state in batch]
        hidden = model.embed(inputs)
        cos, sin = model.rotary(torch.tensor(positions))
        for index, layer in enumerate(model.layers):
            q, k, v = layer.project_qkv(hidden, cos, sin)
            outputs = []
            for row, state in enumerate(batch):
                cached_k, cached_v = state.cache.write(index, k[:, row], v[:, row])
                query = q[:, row].view(config.num_kv_heads, group, config.head_dim)
                attended = F.scaled_dot_product_attention(
                    query[None], cached_k[None], cached_v[None]
                )
                outputs.append(attended.reshape(1, -1))
            hidden = layer.finish(hidden, torch.cat(outputs))
        logits = model.logits(hidden)
        # Greedy rows take one batched argmax instead of one call each.
        greedy = any(state.request.sampling.is_greedy for state in batch)
        best = logits.argmax(dim=-1).tolist() if greedy else []
        for row, state in enumerate(batch):
            state.cache.advance()
            sampling = state.request.sampling
            if sampling.is_greedy:
                token = best[row]
            else:
                token = sample(logits[row], sampling, state.generator)
            self._emit(state, token, token_logprob(logits[row], token, sampling))
        return produced + len(batch)

    def run_until_idle(self) -> None:
        """Step until every admitted request has finished."""
        while not self.is_idle:
            self.step()

    def _join(self) -> int:
        joined = 0
        while self._waiting and len(self._running) < self.max_batch_size:
            request = self._waiting.pop(0)
            capacity = request.kv.num_tokens + request.max_tokens
            cache = RequestKvCache(request.kv, capacity, self.model.device, self.model.dtype)
            state = _Running(request, cache, request.sampling.generator())
            self._running[request.request_id] = state
            self._emit(state, request.first_token)
            joined += 1
        return joined

    def _emit(self, state: _Running, token: int, logprob: TokenLogprob | None = None) -> None:
        state.output_tokens.append(token)
        request = state.request
        if self.on_token is not None:
            self.on_token(request.request_id, token, logprob)
        stopped = token in self.stop_token_ids and not request.sampling.ignore_eos
        if stopped or len(state.output_tokens) >= request.max_tokens:
            del self._running[request.request_id]
            outputs = tuple(state.output_tokens)
            self._finish(DecodeOutcome(request.request_id, "completed", outputs))

    def _finish(self, outcome: DecodeOutcome) -> None:
        if self.on_finish is not None:
            self.on_finish(outcome)
