"""TwinCluster: the simulated cluster around the Conductor's own ConductorCore.

It plays the driver's part exactly as the live Conductor does: it feeds the core events
with `now_s = env.now` and carries out the effects it returns on simulated instances.
It decides nothing itself; the one local decision, a decode instance's check on arrival,
is the policy's `check_decode_arrival`.
"""

import math
from collections import defaultdict
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import simpy

from backend.policy import events as ev
from backend.policy.calibration import (
    CalibrationConfig,
    Calibrator,
    DecodeStepSample,
    PrefillSample,
)
from backend.policy.core import ConductorCore
from backend.policy.cost_model import CostModel
from backend.policy.decode_load import check_decode_arrival, load_of
from backend.policy.effects import (
    DispatchDecode,
    DispatchPrefill,
    Effect,
    EffectHandler,
    Evict,
    FailRequest,
    Reject,
    Replicate,
    carry_out,
)
from backend.policy.lines import PrefillLines
from twin.config import TwinConfig
from twin.decode import DecodeInstance, DecodeJob
from twin.host import SharedHost
from twin.prefill import PrefillInstance, PrefillJob
from twin.recorder import Recorder, RequestRecord
from twin.shard import KvEvent, PoolShard
from twin.timing import TimingModel

# Loads are sampled ten times per series window and averaged per window.
SAMPLES_PER_WINDOW = 10


@dataclass(frozen=True, slots=True)
class LiveCalibration:
    """The live Conductor's calibration as the measured window began, on the twin's clock,
    for a twin that predicts that window: its model and its window of measurements
    (`Calibrator.to_state()`, every `time_s` on the twin's clock) and when it last refit.

    Its model was fitted from live's warm-up (on a short warm-up a long prefill's believed
    time moved between 0.46 and 1.36 s from one run to the next) and it stays in force until
    live's next refit is due; a twin that refit on its own replay of the warm-up believed
    otherwise from the window's first second, and refused in other bursts than live did.
    So the twin takes it over at `from_s`: its replay of the warm-up refits nothing and adds
    no measurement (the warm-up's are live's), and from `from_s` on it refits when live's
    next refit was due, on live's warm-up measurements and its own of the window.

    `beliefs`: what live believed over the warm-up, (from when, model), oldest first, the
    first from before the replay's start: the twin's replay of the warm-up believes each
    from its time, so it refuses (or not) the warm-up's requests near an SLO by the model
    live judged them by (on a speed-1 warm-up one 3,770-token request was refused or not by
    the model live had refitted 24 s in from the warm-up's first long prefills, and with it
    went 3,760 reused tokens of a later one). None for runs kept before live kept them: the
    replay then believes the model of the warm-up's end throughout."""

    state: Mapping[str, Any]
    last_refit_s: float  # -inf: it had not refit
    from_s: float
    beliefs: Sequence[tuple[float, CostModel]] | None = None
    # The rules live refitted by (its `calibration_*` settings); None: the defaults.
    config: CalibrationConfig | None = None

    @classmethod
    def of_inputs(
        cls,
        inputs: Mapping[str, Any],
        *,
        zero_s: float,
        last_refit_s: float | None,
        from_s: float,
    ) -> "LiveCalibration":
        """Live's calibration from what its Conductor kept (`profile_inputs`: its window's
        state with the refits' beliefs, its base profile and its settings), every time
        moved onto the twin's clock, whose zero is `zero_s` on live's.

        Before the first refit the window still keeps, live believed its base profile;
        where it had refitted before that (an older refit the window has let go: a long
        Conductor's oldest kept belief is the one in force as its window began), the
        oldest kept belief stands in for what came before. Kept runs from before the
        Conductor kept its beliefs have none: the twin then believes the window's end's
        model throughout (`beliefs` None)."""
        window = inputs["window"]
        state = {
            **window,
            **{
                kind: [{**sample, "time_s": sample["time_s"] - zero_s} for sample in window[kind]]
                for kind in ("prefill", "decode", "serving", "host_cpu")
                if kind in window
            },
        }
        kept = window.get("beliefs")
        beliefs: list[tuple[float, CostModel]] | None = None
        if kept is not None:
            state["beliefs"] = [{**b, "time_s": b["time_s"] - zero_s} for b in kept]
            beliefs = [
                (float(b["time_s"]) - zero_s, CostModel.from_profile(b["cost"])) for b in kept
            ]
            let_go = int(window.get("num_refits", 0)) > len(beliefs)
            if beliefs and (beliefs[0][0] <= 0 or let_go):
                beliefs[0] = (-math.inf, beliefs[0][1])
            else:
                beliefs.insert(0, (-math.inf, CostModel.from_profile(inputs["base"])))
        return cls(
            state=state,
            last_refit_s=-math.inf if last_refit_s is None else last_refit_s - zero_s,
            from_s=from_s,
            beliefs=beliefs,
            config=CalibrationConfig.from_json(inputs.get("config", {})),
        )


class TwinCluster(EffectHandler):
    """Prefill and decode instances, their shards and links, and the core that steers them."""

    def __init__(
        self,
        config: TwinConfig,
        timing: TimingModel,
        cost: CostModel,
        *,
        dram_blocks: int,
        ssd_blocks: int,
        decode_kv_capacity_tokens: int,
        live_calibration: LiveCalibration | None = None,
    ) -> None:
        self.config = config
        self.policy = config.policy_config()
        self.timing = timing
        self.env = simpy.Environment()
        self.core = ConductorCore(self.policy, cost)
        rules = (live_calibration and live_calibration.config) or CalibrationConfig()
        self.calibrator = Calibrator(cost, rules) if config.calibrate else None
        # Until the window's start the calibration is live's (LiveCalibration).
        self._calibrating = self.calibrator is not None and live_calibration is None
        if self.calibrator is not None and live_calibration is not None:
            if live_calibration.beliefs is not None:
                self.env.process(self._believe_as_live(live_calibration))
            self.env.process(self._take_over(live_calibration))
        self.recorder = Recorder()
        self._arrivals: dict[str, ev.RequestArrived] = {}
        self._jobs: dict[str, PrefillJob] = {}
        # When the last dispatch to each prefill instance reaches it (dispatches keep order).
        self._last_reach_s: dict[PrefillInstance, float] = defaultdict(float)
        # What the core sees of each instance's queue, as the live runtime keeps it: a
        # prefill starts when dispatched to an empty line or when the answer of the one
        # ahead of it comes back.
        self._lines = PrefillLines()
        self._num_requests = 0
        self._all_done = self.env.event()
        # Instances of a live profile measured on one host crowd its cores as live did.
        cores = timing.host_cores
        self.host = SharedHost(self.env, cores) if cores is not None else None
        self.prefill = {
            f"prefill-{n:02d}": PrefillInstance(
                self.env,
                f"prefill-{n:02d}",
                timing,
                PoolShard(f"prefill-{n:02d}", dram_blocks, ssd_blocks, config.eviction),
                block_size=config.block_size,
                chunk_tokens=config.prefill_chunk_tokens,
                on_kv_events=self._apply_kv_events,
                on_finished=self._on_prefill_finished,
                host=self.host,
            )
            for n in range(config.num_prefill)
        }
        instances = list(self.prefill.values())
        for start in range(0, len(instances), config.pipeline_group):
            group = instances[start : start + config.pipeline_group]
            for member in group:
                member.group = group
        self.decode = {
            f"decode-{n:02d}": DecodeInstance(
                self.env,
                f"decode-{n:02d}",
                timing,
                decode_kv_capacity_tokens,
                on_start=self._on_decode_started,
                on_finish=self._on_decode_finished,
                host=self.host,
                on_steps=self._on_decode_steps if self.calibrator is not None else None,
            )
            for n in range(config.num_decode)
        }
        for instance_id in self.prefill:
            self._feed(ev.AgentJoined(0.0, instance_id, "prefill"))
        for instance_id in self.decode:
            self._feed(ev.AgentJoined(0.0, instance_id, "decode", decode_kv_capacity_tokens))

    # -- running --------------------------------------------------------------------------
    def run(self, arrivals: Sequence[ev.RequestArrived], on_progress=None) -> None:
        """Replay `arrivals` (sorted by now_s) until every request has ended."""
        self._num_requests = len(arrivals)
        if not arrivals:
            return
        last_arrival_s = arrivals[-1].now_s
        self.env.process(self._arrive(arrivals, on_progress, last_arrival_s))
        self.env.process(self._sample_loads())
        self.env.run(until=self._all_done)

    def _arrive(self, arrivals, on_progress, last_arrival_s: float) -> Generator[Any, Any, None]:
        env = self.env
        records = self.recorder.records
        for number, arrival in enumerate(arrivals, start=1):
            if arrival.now_s > env.now:
                yield env.timeout(arrival.now_s - env.now)
            records[arrival.request_id] = RequestRecord(
                arrival.request_id,
                env.now,
                arrival.num_input_tokens,
                arrival.num_output_tokens,
            )
            self._arrivals[arrival.request_id] = arrival
            self._carry_out(self._feed(arrival))
            if on_progress is not None and number % 256 == 0 and last_arrival_s > 0:
                on_progress(min(1.0, env.now / last_arrival_s))

    def _sample_loads(self) -> Generator[Any, Any, None]:
        env = self.env
        tbt_slo_s = self.policy.tbt_slo_s
        decode = list(self.decode.values())
        while not self._all_done.triggered:
            prefill_loads = self.core.prefill_loads(env.now)
            prefill_load = sum(prefill_loads.values()) / len(prefill_loads)
            # As the policy defines it: TBT over its SLO or KV memory share, the higher.
            decode_load = sum(
                max(d.step_s / tbt_slo_s, d.context_tokens / d.kv_capacity_tokens)
                if d.kv_capacity_tokens
                else d.step_s / tbt_slo_s
                for d in decode
            ) / len(decode)
            self.recorder.sample_loads(env.now, prefill_load, decode_load)
            yield env.timeout(self.config.series_interval_s / SAMPLES_PER_WINDOW)

    # -- the core -------------------------------------------------------------------------
    def _feed(self, event: ev.Event) -> tuple[Effect, ...]:
        # Settle early-predicted's due forecasts against the pool as it really is (the core
        # does not see the tokens generated in the twin), before the core would.
        self.core.forecasts.settle(event.now_s, self._decode_load_now)
        return self.core.handle(event)

    def _decode_load_now(self) -> float:
        """The mean decode load of the real batches, in the policy's terms (its step model)."""
        cost, tbt_slo_s = self.core.cost, self.policy.tbt_slo_s
        loads = [
            load_of(cost, d.batch_size, d.context_tokens, tbt_slo_s, d.kv_capacity_tokens or None)
            for d in self.decode.values()
        ]
        return sum(loads) / len(loads)

    def _carry_out(self, effects: Sequence[Effect]) -> None:
        carry_out(self, effects)

    # -- the effects (EffectHandler) ------------------------------------------------------
    def on_dispatch_prefill(self, effect: DispatchPrefill, *, replicate: bool) -> None:
        self._dispatch_prefill(effect, replicate)

    def on_replicate(self, effect: Replicate) -> None:
        self.recorder.num_replicated_blocks += len(effect.keys)
        self.recorder.records[effect.request_id].replicated_blocks += len(effect.keys)

    def on_dispatch_decode(self, effect: DispatchDecode) -> None:
        self.env.process(self._hand_to_decode(effect))

    def on_reject(self, effect: Reject) -> None:
        self._end(effect.request_id, "rejected", reason=effect.reason, stage=effect.stage)

    def on_fail(self, effect: FailRequest) -> None:
        self._end(effect.request_id, "failed", reason=effect.reason)

    def on_evict(self, effect: Evict) -> None:
        shard = self.prefill[effect.instance_id].shard
        self._apply_kv_events(shard.drop(effect.keys, self.env.now))

    def _apply_kv_events(self, events: list[KvEvent]) -> None:
        for event in events:
            self._carry_out(self._feed(event))

    def _end(self, request_id: str, outcome: str, **details: object) -> None:
        self.recorder.end(request_id, outcome, self.env.now, **details)
        self._arrivals.pop(request_id, None)
        self._jobs.pop(request_id, None)
        instance_id = self.recorder.records[request_id].prefill_instance
        if instance_id is not None:  # ended in its prefill's line: the next one starts
            self._carry_out(self._leave_line(instance_id, request_id))
        if self.recorder.num_terminal == self._num_requests and not self._all_done.triggered:
            self._all_done.succeed()

    # -- prefill --------------------------------------------------------------------------
    def _dispatch_prefill(self, dispatch: DispatchPrefill, retain_fetched: bool) -> None:
        arrival = self._arrivals[dispatch.request_id]
        plan = dispatch.plan
        record = self.recorder.records[dispatch.request_id]
        record.prefill_instance = dispatch.instance_id
        record.estimated_ttft_s = dispatch.estimated_ttft_s
        record.reused_tokens = plan.num_reused_tokens
        record.computed_tokens = plan.num_compute_tokens
        record.reachable_tokens = (
            max(c.prefix_blocks for c in dispatch.candidates) * self.config.block_size
        )
        source = None
        if plan.fetch is not None:
            source = self.prefill[plan.fetch.source_instance_id]
            record.transferred_tokens = len(plan.fetch.keys) * self.config.block_size
        # Without a Replicate the fetched blocks are used once and not kept.
        keys = arrival.block_keys
        if plan.fetch is not None and not retain_fetched:
            fetched = set(plan.fetch.keys)
            keys = tuple(key for key in keys if key not in fetched)
        job = PrefillJob(dispatch.request_id, arrival.num_input_tokens, keys, plan, source)
        self._jobs[dispatch.request_id] = job
        if self.host is not None:  # the rest of the host works for it too
            self.host.note_prefill()
        instance = self.prefill[dispatch.instance_id]
        # The serving path's way to the agent (a live profile measures it). It is one path:
        # a request does not overtake one dispatched before it to the same instance, so a
        # burst of arrivals reaches the agent as a burst, in order, as live.
        now_s = self.env.now
        if self._lines.join(dispatch.instance_id, dispatch.request_id):
            self._carry_out(
                self._feed(ev.PrefillStarted(now_s, dispatch.request_id, dispatch.instance_id))
            )
        reaches_s = max(now_s + self.timing.dispatch_delay_s(), self._last_reach_s[instance])
        self._last_reach_s[instance] = reaches_s
        if reaches_s > now_s:
            self.env.process(self._submit_after(instance, job, reaches_s - now_s))
        else:
            instance.submit(job)

    def _submit_after(
        self, instance: PrefillInstance, job: PrefillJob, delay_s: float
    ) -> Generator[Any, Any, None]:
        yield self.env.timeout(delay_s)
        if job.request_id in self._jobs:
            instance.submit(job)

    def _on_prefill_finished(self, job: PrefillJob) -> None:
        record = self.recorder.records[job.request_id]
        record.prefill_compute_s = job.compute_s
        assert record.prefill_instance is not None
        if self._calibrating:
            assert self.calibrator is not None
            reused = job.plan.num_reused_tokens
            self.calibrator.add_prefill(
                [
                    PrefillSample(
                        self.env.now,
                        job.input_tokens,
                        reused,
                        job.worked_s,
                        fetched_tokens=job.fetched_bytes // self.timing.kv_bytes_per_token,
                        fetch_s=job.fetch_s,
                    )
                ]
            )
            self._refit_if_due()
        if job.fetched_bytes and job.source is not None:  # as live measures each fetch
            self._feed(
                ev.TransferMeasured(
                    self.env.now,
                    job.source.instance_id,
                    record.prefill_instance,
                    job.fetched_bytes,
                    job.fetch_s,
                )
            )
        # The answer's way back to the Conductor (a live profile measures it): the core sees
        # the prefill end, and the next in line start, when it arrives.
        answer_s = self.timing.answer_delay_s()
        if answer_s > 0:
            self.env.process(self._answer_after(job, record.prefill_instance, answer_s))
        else:
            self._answered(job, record.prefill_instance)

    def _answer_after(
        self, job: PrefillJob, instance_id: str, delay_s: float
    ) -> Generator[Any, Any, None]:
        yield self.env.timeout(delay_s)
        if job.request_id in self._jobs:
            self._answered(job, instance_id)

    def _answered(self, job: PrefillJob, instance_id: str) -> None:
        """The prefill's answer reached the Conductor: its end (with the seconds the
        instance worked on it, as a live agent reports them) and the next one's start."""
        now_s = self.env.now
        finished = ev.PrefillFinished(now_s, job.request_id, instance_id, job.worked_s)
        self._carry_out((*self._feed(finished), *self._leave_line(instance_id, job.request_id)))

    def _leave_line(self, instance_id: str, request_id: str) -> tuple[Effect, ...]:
        """The request left its prefill's line (answered or ended): the next one still
        waiting there (not ended, not moved to another instance) starts."""

        def waits(waiting_id: str) -> bool:
            record = self.recorder.records.get(waiting_id)
            return (
                waiting_id in self._jobs
                and record is not None
                and record.prefill_instance == instance_id
            )

        starts = self._lines.leave(instance_id, request_id, waits)
        if starts is None:
            return ()
        return self._feed(ev.PrefillStarted(self.env.now, starts, instance_id))

    # -- decode ---------------------------------------------------------------------------
    def _hand_to_decode(self, dispatch: DispatchDecode) -> Generator[Any, Any, None]:
        record = self.recorder.records[dispatch.request_id]
        record.decode_instance = dispatch.instance_id
        decode = self.decode[dispatch.instance_id]
        check = dispatch.arrival_check
        if check is not None:
            reason = check_decode_arrival(
                check,
                batch_size=decode.batch_size,
                context_tokens=decode.context_tokens,
                new_context_tokens=dispatch.num_context_tokens,
                kv_capacity_tokens=decode.kv_capacity_tokens,
            )
            if reason is not None:
                self._feed(
                    ev.DecodeRejected(self.env.now, dispatch.request_id, decode.instance_id, reason)
                )
                self._end(dispatch.request_id, "rejected", reason=reason, stage="decode")
                return
        prefill = self.prefill[record.prefill_instance or ""]
        yield from prefill.send(dispatch.num_context_tokens * self.timing.kv_bytes_per_token)
        first_token_s = self.timing.first_token_delay_s()
        if first_token_s > 0:  # the decode dispatch and the first token's way out
            yield self.env.timeout(first_token_s)
        decode.admit(
            DecodeJob(dispatch.request_id, dispatch.num_context_tokens, record.output_tokens)
        )

    def _on_decode_steps(
        self, batch_size: int, context_tokens: int, step_s: float, num_steps: int
    ) -> None:
        assert self.calibrator is not None
        if not self._calibrating:
            return
        sample = DecodeStepSample(self.env.now, batch_size, context_tokens, step_s)
        self.calibrator.add_decode([sample] * num_steps)
        self._refit_if_due()

    def _believe_as_live(self, live: LiveCalibration) -> Generator[Any, Any, None]:
        """Until the window's start, believe each model live believed from when it did."""
        assert live.beliefs is not None
        for time_s, cost in live.beliefs:
            if time_s >= live.from_s:
                return
            if time_s > self.env.now:
                yield self.env.timeout(time_s - self.env.now)
            if cost != self.core.cost:
                self.core.recost(cost)

    def _take_over(self, live: LiveCalibration) -> Generator[Any, Any, None]:
        """At the window's start, believe and calibrate from where live's Conductor was."""
        yield self.env.timeout(max(0.0, live.from_s - self.env.now))
        calibrator = self.calibrator
        assert calibrator is not None
        calibrator.restore(live.state)
        calibrator.last_refit_s = live.last_refit_s
        self._calibrating = True
        if calibrator.cost != self.core.cost:
            self.core.recost(calibrator.cost)

    def _refit_if_due(self) -> None:
        """As the live runtime does on a heartbeat: refit when due; the core believes the
        new model from its next event on."""
        calibrator = self.calibrator
        assert calibrator is not None
        if calibrator.is_due(self.env.now):
            refit = calibrator.refit(self.env.now)
            if refit.cost != self.core.cost:
                self.core.recost(refit.cost)

    def _on_decode_started(self, job: DecodeJob, now_s: float) -> None:
        record = self.recorder.records[job.request_id]
        record.first_token_s = now_s
        self._feed(ev.DecodeStarted(now_s, job.request_id, record.decode_instance or ""))

    def _on_decode_finished(
        self, job: DecodeJob, now_s: float, tbt_mean_s: float, tbt_max_s: float
    ) -> None:
        self._feed(ev.DecodeFinished(now_s, job.request_id, job.output_tokens))
        self._end(job.request_id, "completed", tbt_mean_s=tbt_mean_s, tbt_max_s=tbt_max_s)
