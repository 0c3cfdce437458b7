"""The decode worker's thread: continuous batching steps, and one token stream per request.

The DecodeWorker is not thread safe; one condition guards it. `submit` registers the
request's stream before the worker sees the request, so tokens and the terminal outcome
(a rejection included) always reach it.
"""

import queue
import threading
import time
from collections import deque

from agents.workers import DecodeOutcome, DecodeRequest, DecodeWorker
from backend.policy.calibration import DecodeStepSample

MAX_STEP_SAMPLES = 4096  # kept for the next heartbeat; the oldest go first

Stream = queue.Queue[int | DecodeOutcome]


class DecodeLoop:
    """Steps `worker` on a daemon thread while it has requests."""

    def __init__(self, worker: DecodeWorker) -> None:
        self.worker = worker
        worker.on_token = self._on_token
        worker.on_finish = self._on_finish
        self.last_step_s = 0.0
        # Every step's (batch, context tokens, seconds), for the Conductor's calibration.
        self._steps: deque[DecodeStepSample] = deque(maxlen=MAX_STEP_SAMPLES)
        self._streams: dict[str, Stream] = {}
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="decode-loop", daemon=True)
        self._thread.start()

    def submit(self, request: DecodeRequest) -> Stream:
        """The request's stream: ints (tokens) then one DecodeOutcome."""
        stream: Stream = queue.Queue()
        with self._cond:
            self._streams[request.request_id] = stream
            try:
                self.worker.submit(request)
            except BaseException:
                self._streams.pop(request.request_id, None)
                raise
            self._cond.notify()
        return stream

    def cancel(self, request_id: str, reason: str) -> bool:
        """Take the request out of the batch (between two steps); False if it is not here."""
        with self._cond:
            return self.worker.cancel(request_id, reason)

    def load(self) -> tuple[int, int]:
        """(batch size, context tokens) now."""
        with self._cond:
            return self.worker.batch_size, self.worker.context_tokens

    def take_steps(self) -> list[DecodeStepSample]:
        """The steps measured since the last call (oldest first)."""
        with self._cond:
            steps = list(self._steps)
            self._steps.clear()
            return steps

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self.worker.is_idle and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                batch_size, context_tokens = self.worker.batch_size, self.worker.context_tokens
                started_s, started_cpu_s = time.perf_counter(), time.thread_time()
                self.worker.step()
                self.last_step_s = time.perf_counter() - started_s
                cpu_s = min(time.thread_time() - started_cpu_s, self.last_step_s)
                self._steps.append(
                    DecodeStepSample(
                        time.time(), batch_size, context_tokens, self.last_step_s, cpu_s
                    )
                )

    def _on_token(self, request_id: str, token: int) -> None:
        self._streams[request_id].put(token)

    def _on_finish(self, outcome: DecodeOutcome) -> None:
        stream = self._streams.pop(outcome.request_id, None)
        if stream is not None:
            stream.put(outcome)
