"""Chunked pipeline parallelism (CPP): a group of prefill stages, one process each.

Stage s of X owns a contiguous range of the model's layers (built from the same preset
and seed, so the weights are the single agent's). A prompt longer than
`prefill_chunk_tokens` is cut into chunks that flow stage 0 -> 1 -> ... as micro-batches:
while stage s runs chunk c, stage s-1 already runs chunk c+1. Hidden states travel as raw
bytes over pipes; each stage keeps the K and V of the chunks it has seen so later chunks
attend to earlier ones, and hands its layers' KV back once the last chunk is through. A
shorter prompt skips the pipeline: stage 0 also holds every layer and runs it alone.
Every wait has a timeout and watches the stage processes, so a dead stage is an error,
never a hang; after any such error the group is closed.
"""

import contextlib
import itertools
import multiprocessing
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np
import torch

from agents.model import LayerKv
from agents.model.model import default_device, default_dtype
from agents.model.registry import resolve_model
from agents.workers.kv_io import BlockSink
from agents.workers.pipeline_stage import CLOSE, PROMPT, WHOLE, StageSpec, encode, stage_main
from agents.workers.pipeline_stage import tensor_from as _tensor_from
from agents.workers.prefill import PrefillResult, PrefillTimings, as_token_tensor
from backend.policy.blocks import block_keys


class PipelineError(RuntimeError):
    """A stage failed, died or timed out; the group is closed and must be rebuilt."""


@dataclass(frozen=True, slots=True)
class ChunkSpan:
    """When `stage` ran chunk `chunk` (time.perf_counter, which is system-wide on Linux)."""

    stage: int
    chunk: int
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class PipelineResult:
    """A group prefill: the single agent's result shape, plus how the chunks ran."""

    prefill: PrefillResult  # logits, the whole prompt's KV per layer, its new full blocks
    spans: tuple[ChunkSpan, ...]  # one per (stage, chunk) that ran
    is_pipelined: bool  # False: a short prompt ran on stage 0 alone
    num_chunks: int

    @property
    def logits(self) -> torch.Tensor:
        return self.prefill.logits

    @property
    def layers(self) -> tuple[LayerKv, ...]:
        return self.prefill.layers


def split_layers(num_layers: int, num_stages: int) -> list[range]:
    """Contiguous layer ranges, as even as possible, the earlier stages taking any extra."""
    if num_stages <= 0 or num_stages > num_layers:
        raise ValueError(f"num_stages must be in [1, {num_layers}] (the layers), got {num_stages}")
    base, extra = divmod(num_layers, num_stages)
    bounds = [0]
    for stage in range(num_stages):
        bounds.append(bounds[-1] + base + (stage < extra))
    return [range(a, b) for a, b in itertools.pairwise(bounds)]


class PipelineGroup:
    """X prefill stages in separate processes, fed chunk by chunk; see the module docstring."""

    def __init__(
        self,
        preset: str,
        num_stages: int,
        *,
        seed: int = 0,
        block_size: int,
        prefill_chunk_tokens: int,
        device: str | None = None,
        dtype: torch.dtype | None = None,
        timeout_s: float = 60.0,
        start_timeout_s: float = 120.0,
    ) -> None:
        self.config = resolve_model(preset).model_config()
        self.ranges = split_layers(self.config.num_layers, num_stages)
        for name, value in (
            ("block_size", block_size),
            ("prefill_chunk_tokens", prefill_chunk_tokens),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if timeout_s <= 0 or start_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        resolved = torch.device(device) if device is not None else default_device()
        self.dtype = dtype if dtype is not None else default_dtype(resolved)
        self.num_stages = num_stages
        self.block_size = block_size
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.timeout_s = timeout_s
        self._next_request_id = 0
        self._closed = False
        self._processes: list[Any] = []
        self._reports: list[Connection] = []
        context = multiprocessing.get_context("spawn")
        feed_out, self._feed = context.Pipe(duplex=False)
        inbox = feed_out
        for stage, layers in enumerate(self.ranges):
            spec = StageSpec(
                preset, seed, str(resolved), str(self.dtype).removeprefix("torch."),
                block_size, stage, num_stages, layers.start, layers.stop,
            )  # fmt: skip
            is_last = stage == num_stages - 1
            next_inbox, outbox = (None, None) if is_last else context.Pipe(duplex=False)
            report_in, report_out = context.Pipe(duplex=False)
            process = context.Process(
                target=stage_main,
                args=(spec, inbox, outbox, report_out),
                name=f"cpp-stage-{stage}",
                daemon=True,
            )
            process.start()
            # Drop our copies of the stage's ends, so its death reads as EOF / a broken pipe.
            for end in (inbox, outbox, report_out):
                if end is not None:
                    end.close()
            self._processes.append(process)
            self._reports.append(report_in)
            inbox = next_inbox
        try:
            for stage in range(num_stages):
                self._receive(stage, "ready", start_timeout_s)
        except BaseException:
            self.close()
            raise

    @property
    def stage_pids(self) -> list[int]:
        return [process.pid for process in self._processes]

    def prefill(self, token_ids: Sequence[int] | np.ndarray | torch.Tensor) -> PipelineResult:
        """Prefill a prompt: pipelined in chunks if it is longer than one chunk, else on stage 0."""
        tokens = as_token_tensor(token_ids)
        is_pipelined = tokens.numel() > self.prefill_chunk_tokens and self.num_stages > 1
        return self._prefill(tokens, pipelined=is_pipelined)

    def _prefill(self, tokens: torch.Tensor, *, pipelined: bool) -> PipelineResult:
        if self._closed:
            raise PipelineError("the pipeline group is closed")
        vocab_size = self.config.vocab_size
        if int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size:
            raise ValueError(f"token ids must lie in [0, {vocab_size})")
        started_s = time.perf_counter()
        request_id, num_tokens = self._next_request_id, tokens.numel()
        self._next_request_id += 1
        payload = tokens.numpy().tobytes()
        if pipelined:
            message = encode(
                PROMPT, request_id, 0, 0, 0, num_tokens, self.prefill_chunk_tokens, payload=payload
            )
        else:
            message = encode(WHOLE, request_id, 0, 0, 0, num_tokens, payload=payload)
        try:
            self._feed.send_bytes(message)
            stages = range(self.num_stages) if pipelined else range(1)
            reports = [self._receive(stage, "done", self.timeout_s) for stage in stages]
        except BaseException:
            self.close()
            raise
        kv_shape = (self.config.num_kv_heads, num_tokens, self.config.head_dim)
        layers: list[LayerKv] = []
        spans: list[ChunkSpan] = []
        for report in reports:
            if report["request_id"] != request_id:
                self.close()
                raise PipelineError(f"stage {report['stage']} answered another request")
            for k, v in report["kv"]:
                layers.append(
                    (_tensor_from(k, self.dtype, kv_shape), _tensor_from(v, self.dtype, kv_shape))
                )
            spans.extend(ChunkSpan(report["stage"], *span) for span in report["spans"])
        logits = _tensor_from(reports[-1]["logits"], torch.float32, (vocab_size,))
        done_s = time.perf_counter()
        return PipelineResult(
            prefill=self._as_prefill_result(tokens, logits, layers, done_s - started_s),
            spans=tuple(spans),
            is_pipelined=pipelined,
            num_chunks=-(-num_tokens // self.prefill_chunk_tokens) if pipelined else 1,
        )

    def _as_prefill_result(
        self, tokens: torch.Tensor, logits: torch.Tensor, layers: list[LayerKv], total_s: float
    ) -> PrefillResult:
        """The gathered KV in the single agent's shape: per layer, and as new full blocks."""
        block_size = self.block_size
        num_full = tokens.numel() // block_size * block_size
        sink = BlockSink(self.config.num_layers, block_size)
        if num_full:
            for index, (k, v) in enumerate(layers):
                sink.start_store(index, k[:, :num_full], v[:, :num_full])
        return PrefillResult(
            logits=logits,
            num_tokens=tokens.numel(),
            num_cached_tokens=0,
            new_block_keys=tuple(block_keys(tokens.numpy().astype(np.int32), block_size)),
            new_blocks=tuple(sink.wait_all()),
            layers=tuple(layers),
            timings=PrefillTimings(total_s=total_s, load_wait_s=0.0, store_wait_s=0.0),
        )

    def _receive(self, stage: int, expected: str, timeout_s: float) -> Any:
        """The next report of `stage`, watching every stage process for death meanwhile."""
        sentinels = {process.sentinel: index for index, process in enumerate(self._processes)}
        deadline_s = time.monotonic() + timeout_s
        while True:
            left_s = deadline_s - time.monotonic()
            if left_s <= 0:
                raise PipelineError(f"stage {stage} sent no {expected!r} within {timeout_s:g} s")
            ready = wait([self._reports[stage], *sentinels], timeout=left_s)
            if self._reports[stage] in ready:
                return self._read(stage, expected)
            for sentinel in ready:
                dead = sentinels[sentinel]
                # A stage that raised has reported why before exiting: prefer that to the exit.
                if self._reports[dead].poll(0.5):
                    self._read(dead, "error")
                raise self._death(dead)

    def _read(self, stage: int, expected: str) -> Any:
        try:
            kind, *rest = self._reports[stage].recv()
        except EOFError:
            raise self._death(stage) from None
        if kind == "error":
            raise PipelineError(f"pipeline stage {rest[0]} failed:\n{rest[1]}")
        if kind != expected:
            raise PipelineError(f"stage {stage} sent {kind!r}, expected {expected!r}")
        return rest[0]

    def _death(self, stage: int) -> PipelineError:
        process = self._processes[stage]
        process.join(1.0)
        return PipelineError(
            f"pipeline stage {stage} (pid {process.pid}) died with exit code {process.exitcode}"
        )

    def close(self) -> None:
        """Stop every stage: ask politely down the chain, then terminate what is left."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._feed.send_bytes(encode(CLOSE))
        for process in self._processes:
            process.join(2.0)
            if process.is_alive():
                process.terminate()
                process.join(2.0)
        for connection in (self._feed, *self._reports):
            connection.close()

    def __enter__(self) -> "PipelineGroup":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
