"""DecodeInstance: continuous batching at iteration level, simulated by skipping ahead.

Every iteration of a batch takes the same step time until the batch changes, so the
instance advances a shared step counter over whole stretches and wakes when a request
joins or finishes; on a shared host with measured shares of a core also at every step's
end, where the next step draws its own (and its solo time at the batch's context then), and
where the profile measured it, after the loop's pause between two steps, during which the
instance leaves the host's cores to the others and requests join. A request's tokens are
the steps counted while it was in the batch; its TBT gaps are the step times of those
stretches (with the pause before each step). Requests that find the instance's KV memory
full wait for room (or are rejected by the local check when a rejection policy is on).
"""

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import simpy

from twin.host import SharedHost
from twin.timing import TimingModel

_EPSILON_STEPS = 1e-9


@dataclass(slots=True)
class DecodeJob:
    request_id: str
    context_tokens: int
    output_tokens: int  # what the request generates, its first token (the prefill's) included
    # Filled in by the instance:
    joined_step: float = 0.0
    joined_s: float = 0.0
    joined_epoch: int = 0

    @property
    def steps(self) -> int:
        """Decode steps it takes: its first token comes with it from the prefill (a live
        decode agent emits it on joining and retires the request at `output_tokens`)."""
        return max(0, self.output_tokens - 1)


class DecodeInstance:
    """One decode instance; `on_finish(job, now_s, tbt_mean_s, tbt_max_s)` reports the end."""

    def __init__(
        self,
        env: simpy.Environment,
        instance_id: str,
        timing: TimingModel,
        kv_capacity_tokens: int,
        on_start: Callable[[DecodeJob, float], None],
        on_finish: Callable[[DecodeJob, float, float, float], None],
        host: SharedHost | None = None,
        on_steps: Callable[[int, int, float, int], None] | None = None,
    ) -> None:
        """`on_steps(batch_size, context_tokens, step_s, num_steps)`: after each stretch of
        constant batch, its whole steps as a live agent measures them (the calibration)."""
        self.env = env
        self.instance_id = instance_id
        self._on_steps = on_steps
        self._stretch: tuple[int, int, float] | None = None  # batch, context, compute step
        self.timing = timing
        self.kv_capacity_tokens = kv_capacity_tokens
        self._on_start = on_start
        self._on_finish = on_finish
        self.host = host
        self._on_host = False  # counted among the host's busy instances
        if host is not None:
            host.listen(self, self._on_host_change)
        self.jobs: dict[str, DecodeJob] = {}
        self.waiting: deque[DecodeJob] = deque()
        self._finish_heap: list[tuple[float, str]] = []  # (step at which it ends, request)
        self._steps_done = 0.0  # iterations run since the start, fractional
        self._last_advance_s = 0.0
        self.step_s = 0.0
        self._solo_step_s: float | None = None  # this stretch's step, alone on the host
        self._share: Callable[[int], float] | None = None  # its share of a core by count
        self._sum_context_tokens = 0  # prompts of the batch
        self._sum_joined_steps = 0.0  # for the generated tokens of the batch
        self._timer_generation = 0
        self._timer_target = 0.0  # the step count the pending timer lands on
        # Where the profile measured the loop's pauses between steps (on a shared host with
        # measured shares), they replace the serving path's per-token cost.
        self._pauses = host is not None and timing.measures_decode_pauses
        self._in_pause = False  # between two steps: no progress, off the host's cores
        self._pause_s = 0.0  # the pause before the current step (part of its TBT gap)
        # One entry per stretch of constant batch: its step time and tokens produced.
        self.epoch_step_s: list[float] = [0.0]
        self.epoch_tokens: list[float] = [0.0]
        self.epoch_t_s: list[float] = [0.0]  # when each stretch began

    # -- what the cluster sees ------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        return len(self.jobs)

    @property
    def context_tokens(self) -> int:
        """KV tokens of the running batch: prompts plus tokens generated so far."""
        generated = len(self.jobs) * self._steps_now() - self._sum_joined_steps
        return self._sum_context_tokens + int(generated)

    def has_room(self, context_tokens: int) -> bool:
        return self.context_tokens + context_tokens <= self.kv_capacity_tokens

    def admit(self, job: DecodeJob) -> None:
        """Start `job` now if its KV fits, else queue it until a request finishes."""
        if job.steps == 0:  # its one token came from the prefill: done on joining
            self._on_start(job, self.env.now)
            self._on_finish(job, self.env.now, 0.0, 0.0)
            return
        if self.waiting or not self.has_room(job.context_tokens):
            self.waiting.append(job)
            return
        if self._in_pause:  # joins between two steps: the next step starts with it
            self._join(job)
            return
        self._advance()
        self._join(job)
        self._reschedule()

    # -- the batch ------------------------------------------------------------------------
    def _steps_now(self) -> float:
        if not self.jobs or self.step_s <= 0 or self._in_pause:
            return self._steps_done
        return self._steps_done + (self.env.now - self._last_advance_s) / self.step_s

    def _advance(self) -> None:
        """Account the iterations run since the last change of the batch."""
        now_s = self.env.now
        if self.jobs and self.step_s > 0 and not self._in_pause:
            steps = (now_s - self._last_advance_s) / self.step_s
            self._steps_done += steps
            self.epoch_tokens[-1] += steps * len(self.jobs)
        self._last_advance_s = now_s

    def _join(self, job: DecodeJob) -> None:
        job.joined_step = self._steps_done
        job.joined_s = self.env.now
        job.joined_epoch = len(self.epoch_step_s)
        self.jobs[job.request_id] = job
        self._sum_context_tokens += job.context_tokens
        self._sum_joined_steps += job.joined_step
        heapq.heappush(self._finish_heap, (job.joined_step + job.steps, job.request_id))
        self._on_start(job, self.env.now)

    def _reschedule(self, *, redraw: bool = True) -> None:
        """New step time for the batch as it now stands, and a timer for the next finish;
        `redraw` False: only the host's count changed, so the stretch keeps its draws."""
        host = self.host
        if host is not None and bool(self.jobs) != self._on_host:
            self._on_host = bool(self.jobs)
            if self._on_host:
                host.enter(self)
            else:
                host.leave(self)
        self._report_stretch()
        if redraw or self._solo_step_s is None:
            # A new step or batch: its solo time (drawn from the measured spread) and its
            # luck with the host's scheduler, both kept while only the host's count
            # changes (see MeasuredSpread.decode_share).
            self._solo_step_s = self.timing.decode_step_s(len(self.jobs), self.context_tokens)
            self._share = self.timing.decode_share() if host is not None else None
        self.step_s = self._solo_step_s
        if host is not None:
            # slowed while the host is crowded: by the share of a core the live steps got
            # at as many busy agents, else by processor sharing
            self.step_s /= host.rate("decode", self._share, self._solo_step_s)
        if self.jobs and self._on_steps is not None:
            self._stretch = (len(self.jobs), self.context_tokens, self.step_s)
        gap_s = self.step_s
        if self._pauses:
            gap_s += self._pause_s  # the tokens' gap: the pause before the step, the step
        elif self.jobs:
            # A live profile without measured pauses adds what streaming each token costs
            # beyond the step.
            self.step_s += self.timing.serving.per_token_s
            gap_s = self.step_s
        self.epoch_step_s.append(gap_s)
        self.epoch_tokens.append(0.0)
        self.epoch_t_s.append(self.env.now)
        self._timer_generation += 1
        if not self._finish_heap:
            return
        target = self._finish_heap[0][0]
        if self._share is not None:
            # Each step draws its own luck with the host's scheduler: the timer also lands
            # where the next step starts, and the batch draws again there (see
            # MeasuredSpread.decode_share).
            target = min(target, math.floor(self._steps_done + _EPSILON_STEPS) + 1.0)
        self._timer_target = target
        steps_left = max(0.0, target - self._steps_done)
        timer = self.env.timeout(steps_left * self.step_s)
        generation = self._timer_generation
        timer.callbacks.append(lambda _event: self._on_timer(generation))

    def _report_stretch(self) -> None:
        """The stretch now ending, as whole steps (tokens produced / batch size)."""
        stretch, self._stretch = self._stretch, None
        if stretch is None or self._on_steps is None:
            return
        batch_size, context_tokens, step_s = stretch
        num_steps = round(self.epoch_tokens[-1] / batch_size)
        if num_steps > 0:
            self._on_steps(batch_size, context_tokens, step_s, num_steps)

    def _on_host_change(self) -> None:
        """Another instance began or stopped computing: re-time the running batch."""
        if self.jobs and not self._in_pause:
            self._advance()
            self._reschedule(redraw=False)

    def _on_timer(self, generation: int) -> None:
        if generation != self._timer_generation:
            return  # the batch changed since this timer was set
        self._advance()
        now_s = self.env.now
        heap = self._finish_heap
        # The timer was set to land exactly on a step's end (the head job's last, or the
        # next draw's): snap the counter to it, so float error (large clocks, small steps)
        # cannot leave it a hair short and spin on ever tinier timers.
        if self._timer_target > self._steps_done:
            self._steps_done = self._timer_target
        while heap and heap[0][0] <= self._steps_done + _EPSILON_STEPS:
            _, request_id = heapq.heappop(heap)
            job = self.jobs.pop(request_id)
            self._sum_context_tokens -= job.context_tokens
            self._sum_joined_steps -= job.joined_step
            elapsed_s = now_s - job.joined_s
            tbt_mean_s = elapsed_s / job.steps if job.steps else 0.0
            tbt_max_s = max(self.epoch_step_s[job.joined_epoch :], default=self.step_s)
            self._on_finish(job, now_s, tbt_mean_s, tbt_max_s)
        if not self.jobs:
            # Reset the fractional counter so float error cannot build up over hours.
            self._steps_done = 0.0
            self._sum_joined_steps = 0.0
            heap.clear()
        while self.waiting and self.has_room(self.waiting[0].context_tokens):
            self._join(self.waiting.popleft())
        # A request that joined mid-step ends mid-step: the loop pauses only between steps.
        at_step_end = abs(self._steps_done - round(self._steps_done)) < _EPSILON_STEPS
        if not self.jobs:
            self._pause_s = 0.0  # the loop waits for work: no pause before the next step
        elif at_step_end and self._pauses and self._share is not None and self.host is not None:
            pause_s = self.timing.decode_pause_s(self.host.num_busy - self._on_host)
            if pause_s is not None and pause_s > 0:
                self._pause(pause_s)
                return
            self._pause_s = 0.0
        self._reschedule()

    def _pause(self, pause_s: float) -> None:
        """Between two steps for `pause_s`: off the host's cores, no progress; requests that
        come meanwhile join the next step."""
        self._report_stretch()
        if self._on_host and self.host is not None:
            self._on_host = False
            self.host.leave(self)
        self._in_pause = True
        self._pause_s = pause_s
        self._timer_generation += 1
        generation = self._timer_generation
        timer = self.env.timeout(pause_s)
        timer.callbacks.append(lambda _event: self._end_pause(generation))

    def _end_pause(self, generation: int) -> None:
        if generation != self._timer_generation:
            return
        self._in_pause = False
        self._last_advance_s = self.env.now
        self._reschedule()
