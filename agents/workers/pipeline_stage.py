"""One stage of a chunked-pipeline prefill group: its layers, its KV and its process loop.

A stage runs in its own process. It reads messages from the stage before it (stage 0
reads the group's requests), runs its contiguous range of layers on each chunk, keeps the
chunk's K and V so later chunks attend to earlier ones, and passes the chunk's hidden
states on as raw bytes. When a request's last chunk is done it reports its spans, its KV
(and, on the last stage, the logits) to the group on its own report pipe. Stage 0 also
keeps every layer, so it serves short prompts alone through a PrefillWorker.
"""

import contextlib
import queue
import struct
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch

from agents.model import LlamaModel, build_model
from agents.model.layers import causal_attention
from agents.workers.prefill import PrefillWorker

# kind, request_id, chunk_index, start, num_tokens, total_tokens, chunk_tokens
HEADER = struct.Struct("<BxxxIIIIII")
PROMPT, CHUNK, WHOLE, CLOSE = 1, 2, 3, 4


@dataclass(frozen=True, slots=True)
class StageSpec:
    """What a stage process builds: a model slice, and where it sits in the group."""

    preset: str
    seed: int
    device: str
    dtype: str
    block_size: int
    stage: int
    num_stages: int
    first_layer: int
    end_layer: int


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """A tensor's raw bytes (any dtype, bf16 included), copied to the CPU if needed."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes()


def tensor_from(
    data: bytes | memoryview, dtype: torch.dtype, shape: tuple[int, ...]
) -> torch.Tensor:
    """A CPU tensor of `shape` over a writable copy of `data`."""
    raw = torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy())
    return raw.view(dtype).reshape(shape)


def encode(kind: int, request_id: int = 0, *fields: int, payload: bytes = b"") -> bytes:
    values = (*fields, *(0,) * (5 - len(fields)))
    return HEADER.pack(kind, request_id, *values) + payload


class _Forwarder:
    """Sends to the next stage from a thread, so a stage computes its next chunk while the
    next stage is still busy and has not yet taken this one (a pipe holds only 64 KiB)."""

    def __init__(self, outbox: Connection | None) -> None:
        self._outbox = outbox
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=4)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="cpp-forwarder", daemon=True)
        self._thread.start()

    def send(self, message: bytes) -> None:
        if self._error is not None:
            raise self._error
        if self._outbox is not None:
            self._queue.put(message)

    def flush(self) -> None:
        """Send what is queued and stop the thread."""
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while (message := self._queue.get()) is not None:
            try:
                assert self._outbox is not None
                self._outbox.send_bytes(message)
            except BaseException as error:  # re-raised on the stage's own thread
                self._error = error
                return


class _Stage:
    """A stage's layers and the per-request KV buffers its chunks fill."""

    def __init__(self, spec: StageSpec) -> None:
        self.spec = spec
        model = build_model(
            spec.preset, seed=spec.seed, device=spec.device, dtype=getattr(torch, spec.dtype)
        )
        self.model: LlamaModel = model
        self.layers = list(model.layers[spec.first_layer : spec.end_layer])
        if spec.stage:  # only stage 0 serves whole prompts; the others keep just their layers
            del model.layers[spec.end_layer :]
            del model.layers[: spec.first_layer]
        self.is_first = spec.stage == 0
        self.is_last = spec.stage == spec.num_stages - 1
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.spans: list[tuple[int, float, float]] = []

    @torch.no_grad()
    def run_chunk(self, hidden: torch.Tensor, start: int, total: int) -> torch.Tensor:
        """Run this stage's layers on the chunk at positions [start, start + len(hidden))."""
        model, config = self.model, self.model.config
        end = start + hidden.shape[0]
        if start == 0:
            shape = (config.num_kv_heads, total, config.head_dim)
            self.kv = [(hidden.new_empty(shape), hidden.new_empty(shape)) for _ in self.layers]
            self.spans = []
        cos, sin = model.rotary(torch.arange(start, end))
        for layer, (k_all, v_all) in zip(self.layers, self.kv, strict=True):
            q, k, v = layer.project_qkv(hidden, cos, sin)
            k_all[:, start:end], v_all[:, start:end] = k, v
            attention = causal_attention(q, k_all[:, :end], v_all[:, :end], start)
            hidden = layer.finish(hidden, attention)
        return hidden

    def report(self, request_id: int, logits: torch.Tensor | None) -> dict[str, Any]:
        kv = [(tensor_bytes(k), tensor_bytes(v)) for k, v in self.kv]
        self.kv = []
        return {
            "request_id": request_id,
            "stage": self.spec.stage,
            "spans": list(self.spans),
            "kv": kv,
            "logits": None if logits is None else tensor_bytes(logits.float()),
        }


def _serve(
    spec: StageSpec, inbox: Connection, outbox: Connection | None, reports: Connection
) -> None:
    stage = _Stage(spec)
    forwarder = _Forwarder(outbox)
    model, dtype = stage.model, stage.model.dtype
    hidden_size = model.config.hidden_size
    reports.send(("ready", spec.stage))
    while True:
        message = inbox.recv_bytes()
        kind, request_id, chunk, start, num_tokens, total, chunk_tokens = HEADER.unpack_from(
            message
        )
        body = memoryview(message)[HEADER.size :]
        if kind == CLOSE:
            forwarder.send(message)
            forwarder.flush()
            return
        if kind == WHOLE:  # a short prompt: this agent alone, all layers, no pipeline
            tokens = tensor_from(body, torch.int64, (total,))
            started_s = time.perf_counter()
            result = PrefillWorker(model, spec.block_size).prefill(tokens)
            stage.kv = list(result.layers)
            stage.spans = [(0, started_s, time.perf_counter())]
            reports.send(("done", stage.report(request_id, result.logits)))
            continue
        if kind == PROMPT:  # stage 0 cuts the prompt into chunks and feeds them through
            tokens = tensor_from(body, torch.int64, (total,))
            pieces = [(i, s) for i, s in enumerate(range(0, total, chunk_tokens))]
        else:
            pieces = [(chunk, start)]
        for index, first in pieces:
            started_s = time.perf_counter()
            if kind == PROMPT:
                count = min(chunk_tokens, total - first)
                hidden = model.embed(tokens[first : first + count])
            else:
                count = num_tokens
                hidden = tensor_from(body, dtype, (count, hidden_size)).to(model.device)
            hidden = stage.run_chunk(hidden, first, total)
            is_done = first + count == total
            logits = model.logits(hidden[-1:])[0] if stage.is_last and is_done else None
            stage.spans.append((index, started_s, time.perf_counter()))
            if not stage.is_last:
                fields = (index, first, count, total)
                forwarder.send(encode(CHUNK, request_id, *fields, payload=tensor_bytes(hidden)))
            if is_done:
                reports.send(("done", stage.report(request_id, logits)))


def stage_main(
    spec: StageSpec, inbox: Connection, outbox: Connection | None, reports: Connection
) -> None:
    """A stage process's entry point: one torch thread, then serve until CLOSE or an error."""
    torch.set_num_threads(1)
    try:
        _serve(spec, inbox, outbox, reports)
    except EOFError:  # the stage before us, or the group, went away: nothing left to do
        pass
    except BaseException:
        with contextlib.suppress(OSError):
            reports.send(("error", spec.stage, traceback.format_exc()))
        raise SystemExit(1) from None
