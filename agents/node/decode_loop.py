"""The decode worker's thread: continuous batching steps, and one token stream per request.

The DecodeWorker is not thread safe; one condition guards it. `submit` registers the
request's stream before the worker sees the request, so tokens and the terminal outcome
(a rejection included) always reach it.

The stepping thread holds the condition through each step and would take it back at once
after (Python's locks are not fair: a waiting thread rarely gets in, and a busy batch kept
heartbeats, GetState and cancels waiting for seconds). So every other caller announces
itself before it waits, and the stepping thread lets the announced ones in before its next
step.
"""

import queue
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

from agents.workers import DecodeOutcome, DecodeRequest, DecodeWorker, TokenLogprob
from backend.policy.calibration import DecodeStepSample

MAX_STEP_SAMPLES = 4096  # kept for the next heartbeat; the oldest go first
# How long the stepping thread waits at most for announced callers to take the condition.
MAX_YIELD_S = 0.1

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
        self._num_callers = 0  # other threads waiting for the condition (see _turn)
        self._callers_lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="decode-loop", daemon=True)
        self._thread.start()

    @contextmanager
    def _turn(self) -> Iterator[None]:
        """The condition, for any thread but the stepping one: announced first, so the
        stepping thread lets it in before its next step."""
        with self._callers_lock:
            self._num_callers += 1
        try:
            self._cond.acquire()
        finally:
            with self._callers_lock:
                self._num_callers -= 1
        try:
            yield
        finally:
            self._cond.release()

    def _let_callers_in(self) -> None:
        """After a step, outside the condition: wait (briefly) until every announced caller
        has taken it."""
        deadline_s = time.perf_counter() + MAX_YIELD_S
        while self._num_callers and time.perf_counter() < deadline_s:
            time.sleep(0.0002)

    def submit(self, request: DecodeRequest) -> Stream:
        """The request's stream: ints (tokens) then one DecodeOutcome."""
        stream: Stream = queue.Queue()
        with self._turn():
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
        with self._turn():
            return self.worker.cancel(request_id, reason)

    def load(self) -> tuple[int, int]:
        """(batch size, context tokens) now."""
        with self._turn():
            return self.worker.batch_size, self.worker.context_tokens

    def take_steps(self) -> list[DecodeStepSample]:
        """The steps measured since the last call (oldest first)."""
        with self._turn():
            steps = list(self._steps)
            self._steps.clear()
            return steps

    def stop(self) -> None:
        with self._turn():
            self._stopped = True
            self._cond.notify()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        ended_s: float | None = None  # the last step's end, while the batch holds requests
        while True:
            with self._cond:
                if self.worker.is_idle:
                    ended_s = None  # waiting for work is no pause between steps
                while self.worker.is_idle and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                batch_size, context_tokens = self.worker.batch_size, self.worker.context_tokens
                started_s, started_cpu_s = time.perf_counter(), time.thread_time()
                pause_s = started_s - ended_s if ended_s is not None else None
                self.worker.step()
                ended_s = time.perf_counter()
                self.last_step_s = ended_s - started_s
                cpu_s = min(time.thread_time() - started_cpu_s, self.last_step_s)
                self._steps.append(
                    DecodeStepSample(
                        time.time(), batch_size, context_tokens, self.last_step_s, cpu_s, pause_s
                    )
                )
            self._let_callers_in()

    def _on_token(self, request_id: str, token: int, logprob: TokenLogprob | None) -> None:
        self._streams[request_id].put((token, logprob, time.monotonic()))

    def _on_finish(self, outcome: DecodeOutcome) -> None:
        stream = self._streams.pop(outcome.request_id, None)
        if stream is not None:
            stream.put(outcome)
