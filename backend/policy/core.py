"""ConductorCore: the one object the live Conductor and the digital twin both drive.

It takes events carrying `now_s`, keeps the cluster view (prefix index, prefill queues,
decode batches) and returns effects. All decisions are delegated to the small modules
next to it: routing (Algorithm 1), decode_load (decode selection and prediction),
admission, replicas. It performs no I/O and reads no clock.
"""

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from backend.policy import events as ev
from backend.policy.admission import LoadSnapshot, Rejection, admit
from backend.policy.cluster import DecodeState, PrefillState
from backend.policy.config import PolicyConfig
from backend.policy.cost_model import CostModel
from backend.policy.decode_load import (
    DecodeForecast,
    DecodeTimes,
    ForecastLog,
    choose_decode,
    current_ratio,
    load_of,
    mean_load,
    predicted_mean_ratio,
)
from backend.policy.effects import (
    ArrivalCheck,
    DispatchDecode,
    DispatchPrefill,
    Effect,
    FailRequest,
    Reject,
    Replicate,
)
from backend.policy.index import PrefixIndex
from backend.policy.links import LinkEstimates
from backend.policy.replicas import plan_replica_cap
from backend.policy.routing import PrefillCandidate, route_prefill


@dataclass(slots=True)
class _Admitted:
    """An accepted request the core still tracks, with where its work stands."""

    arrival: ev.RequestArrived
    prefill_instance_id: str | None
    decode_instance_id: str
    predicted_prefill_s: float
    phase: str  # "queued" | "prefilling" | "to_decode" | "decoding"


NO_EFFECTS: tuple[Effect, ...] = ()


class ConductorCore:
    """Routing, admission and bookkeeping for one cluster; see the module docstring."""

    def __init__(
        self, config: PolicyConfig, cost: CostModel, *, max_replicas: int | None = None
    ) -> None:
        self.config = config
        self.cost = cost
        self.max_replicas = max_replicas
        self.index = PrefixIndex()
        self.links = LinkEstimates()
        self.prefill: dict[str, PrefillState] = {}
        self.decode: dict[str, DecodeState] = {}
        self._requests: dict[str, _Admitted] = {}
        self._rng = random.Random(config.seed)
        self._decode_times = DecodeTimes(config.decode_time_window)
        # early-predicted's forecasts, settled against the pool when their moment comes.
        self.forecasts = ForecastLog()
        self._handlers: dict[type, Callable[[Any], tuple[Effect, ...]]] = {
            ev.RequestArrived: self.on_request_arrived,
            ev.PrefillStarted: self.on_prefill_started,
            ev.PrefillFinished: self.on_prefill_finished,
            ev.DecodeStarted: self.on_decode_started,
            ev.DecodeStep: self.on_decode_step,
            ev.DecodeFinished: self.on_decode_finished,
            ev.DecodeRejected: self.on_decode_rejected,
            ev.RequestFailed: self.on_request_failed,
            ev.RequestCancelled: self.on_request_failed,
            ev.RequestRetried: self.on_request_retried,
            ev.KvStored: self.on_kv_stored,
            ev.KvEvicted: self.on_kv_evicted,
            ev.KvDemoted: self.on_kv_demoted,
            ev.KvLost: self.on_kv_lost,
            ev.AgentJoined: self.on_agent_joined,
            ev.AgentDraining: self.on_agent_draining,
            ev.AgentLeft: self.on_agent_left,
            ev.TransferMeasured: self.on_transfer_measured,
            ev.Tick: self.on_tick,
        }

    # -- entry point ----------------------------------------------------------------------
    def handle(self, event: ev.Event) -> tuple[Effect, ...]:
        """Apply one event and return the effects the driver must carry out, in order."""
        self.forecasts.settle(event.now_s, self._mean_decode_load)
        return self._handlers[type(event)](event)

    def _mean_decode_load(self) -> float:
        return mean_load(self.cost, self.decode.values(), self.config.tbt_slo_s)

    def reconfigure(self, config: PolicyConfig) -> None:
        """Switch knobs (threshold, scheduler, admission, SLOs) keeping the cluster view."""
        self.config = config
        self._decode_times.resize(config.decode_time_window)

    def recost(self, cost: CostModel) -> None:
        """Believe a new cost model (a calibration refit) from the next event on; work already
        queued keeps the prediction it was booked with."""
        self.cost = cost

    @property
    def decode_time_s(self) -> float:
        """Mean decode time: learned from recent completions when `learn_decode_time`, else
        the configured uniform t_d (used for Retry-After hints)."""
        learned = self._decode_times.mean_s()
        if self.config.learn_decode_time and learned is not None:
            return learned
        return self.config.decode_time_s

    @property
    def decode_forecast(self) -> DecodeForecast:
        """How early-predicted forecasts a request's decode (decode_load.DecodeForecast)."""
        if not self.config.learn_decode_time:
            return DecodeForecast(uniform_s=self.config.decode_time_s)
        return self._decode_times.forecast()

    @property
    def num_in_flight(self) -> int:
        return len(self._requests)

    def prefill_loads(self, now_s: float) -> dict[str, float]:
        """Each prefill instance's load: its queue time over the TTFT SLO."""
        slo_s = self.config.ttft_slo_s
        return {pid: self.queue_s(state, now_s) / slo_s for pid, state in self.prefill.items()}

    def queue_s(self, state: PrefillState, now_s: float) -> float:
        """T_queue of one prefill instance: its queue at its pace, with the line's
        hand-overs as the cost model believes them."""
        return state.queue_s(now_s, self.unmeasured_pace(), self.cost.serving.handover_s)

    def unmeasured_pace(self) -> float:
        """The pace believed of a prefill instance none of whose prefills was measured yet:
        the mean of the measured ones (an instance must not look faster for being new)."""
        measured = [m for s in self.prefill.values() if (m := s.measured_pace()) is not None]
        return sum(measured) / len(measured) if measured else 1.0

    def decode_loads(self) -> dict[str, float]:
        """Each decode instance's load: TBT ratio or KV memory share of its running batch."""
        slo_s = self.config.tbt_slo_s
        return {
            did: load_of(
                self.cost, len(s.decoding), s.decoding_context_tokens, slo_s, s.kv_capacity_tokens
            )
            for did, s in self.decode.items()
        }

    # -- requests -------------------------------------------------------------------------
    def on_request_arrived(self, event: ev.RequestArrived) -> tuple[Effect, ...]:
        if event.request_id in self._requests:
            raise ValueError(f"request {event.request_id!r} is already in flight")
        return self._place(event, apply_admission=True)

    def _place(self, event: ev.RequestArrived, *, apply_admission: bool) -> tuple[Effect, ...]:
        """Route, pick decode, admit and book one request (new, or re-routed after a loss)."""
        config = self.config
        now_s = event.now_s
        if apply_admission and len(self._requests) >= config.max_in_flight_requests:
            return (
                Reject(
                    event.request_id,
                    reason="in_flight_limit",
                    stage="admission",
                    message=f"{len(self._requests)} requests are in flight, the configured "
                    f"limit (max_in_flight_requests)",
                    retry_after_s=1.0,
                ),
            )
        prefill = {pid: s for pid, s in self.prefill.items() if not s.draining}
        decode = [s for s in self.decode.values() if not s.draining]
        if not prefill or not decode:
            missing = "prefill" if not prefill else "decode"
            reason = f"no_{missing}_instance"
            if not apply_admission:
                return (FailRequest(event.request_id, reason),)
            return (
                Reject(
                    event.request_id,
                    reason=reason,
                    stage="admission",
                    message=f"no {missing} instance is available",
                    retry_after_s=5.0,
                ),
            )
        unmeasured = self.unmeasured_pace()
        candidates = [
            PrefillCandidate(
                pid,
                state.queue_s(now_s, unmeasured, self.cost.serving.handover_s),
                state.link_backlog_s(now_s),
                state.pace(now_s, unmeasured),
            )
            for pid, state in prefill.items()
        ]
        prefix_blocks = self.index.prefix_blocks(event.block_keys, prefill)
        choice = route_prefill(
            candidates,
            prefix_blocks,
            event.block_keys,
            scheduler=config.prefill_scheduler,
            num_input_tokens=event.num_input_tokens,
            block_size=config.block_size,
            threshold=config.effective_threshold,
            cost=self.cost,
            rng=self._rng,
            links=self.links,
        )
        chosen = choice.chosen
        tbt_slo_s = event.tbt_slo_s or config.tbt_slo_s
        decode_state = choose_decode(self.cost, decode, event.num_input_tokens, tbt_slo_s)
        if apply_admission:
            rejection = self._admit(event, chosen.ttft_s, decode_state, tbt_slo_s)
            if rejection is not None:
                return (
                    Reject(
                        event.request_id,
                        reason=rejection.reason,
                        stage=rejection.stage,
                        message=rejection.message,
                        retry_after_s=rejection.retry_after_s,
                    ),
                )
        prefill_state = self.prefill[chosen.instance_id]
        occupancy_s = chosen.transfer_s + chosen.prefill_s
        prefill_state.enqueue(event.request_id, occupancy_s)
        forecast = self.decode_forecast
        batch = len(decode_state.decoding) + len(decode_state.incoming) + 1
        context = decode_state.decoding_context_tokens + event.num_input_tokens
        decode_state.add_incoming(
            event.request_id,
            event.num_input_tokens,
            now_s + chosen.ttft_s,
            expected_s=forecast.decode_s(
                event.num_output_tokens, self.cost.decode.step_s(batch, context)
            ),
            expected_tokens=forecast.expected_tokens(event.num_output_tokens),
        )
        self._requests[event.request_id] = _Admitted(
            arrival=event,
            prefill_instance_id=chosen.instance_id,
            decode_instance_id=decode_state.instance_id,
            predicted_prefill_s=occupancy_s,
            phase="queued",
        )
        dispatch = DispatchPrefill(
            request_id=event.request_id,
            instance_id=chosen.instance_id,
            decode_instance_id=decode_state.instance_id,
            plan=choice.plan,
            estimated_queue_s=chosen.queue_s,
            estimated_transfer_s=chosen.transfer_s,
            estimated_prefill_s=chosen.prefill_s,
            estimated_ttft_s=chosen.ttft_s,
            candidates=choice.candidates,
        )
        fetch = choice.plan.fetch
        if fetch is None:
            return (dispatch,)
        # The transfer occupies the holder's outgoing link; later fetches queue behind it.
        # (transfer_s already includes the backlog it waits behind.)
        self.prefill[fetch.source_instance_id].link_busy_until_s = now_s + chosen.transfer_s
        replicate = Replicate(
            event.request_id, fetch.source_instance_id, chosen.instance_id, fetch.keys
        )
        return (dispatch, replicate)

    def _admit(
        self,
        event: ev.RequestArrived,
        estimated_ttft_s: float,
        decode_state: DecodeState,
        tbt_slo_s: float,
    ) -> Rejection | None:
        policy = self.config.rejection_policy
        if policy == "none":
            return None
        predicted = None
        own_share = 0.0
        if policy == "early-predicted":
            capacity = decode_state.kv_capacity_tokens
            if capacity and self.decode:  # its KV's share of the mean over instances
                own_share = event.num_input_tokens / capacity / len(self.decode)
            predicted = predicted_mean_ratio(
                self.cost,
                self.decode.values(),
                chosen_instance_id=decode_state.instance_id,
                context_tokens=event.num_input_tokens,
                at_s=event.now_s + estimated_ttft_s,
                tbt_slo_s=tbt_slo_s,
            )
        loads = LoadSnapshot(
            # Admission judges the TTFT the client will see: the serving path's own costs too.
            estimated_ttft_s=estimated_ttft_s + self.cost.serving.ttft_overhead_s,
            ttft_slo_s=event.ttft_slo_s or self.config.ttft_slo_s,
            current_decode_load=current_ratio(
                self.cost, decode_state, event.num_input_tokens, tbt_slo_s
            ),
            predicted_decode_load=predicted,
            decode_time_s=self.decode_time_s,
            predicted_load_limit=self.config.predicted_load_limit,
            own_decode_share=own_share,
            predicted_size_weight=self.config.predicted_size_weight,
        )
        rejection = admit(policy, loads)
        if rejection is None and predicted is not None:  # judged when its prefill ends
            self.forecasts.add(event.now_s, event.now_s + estimated_ttft_s, predicted)
        return rejection

    def on_prefill_started(self, event: ev.PrefillStarted) -> tuple[Effect, ...]:
        admitted = self._requests.get(event.request_id)
        if admitted is None or admitted.prefill_instance_id != event.instance_id:
            return NO_EFFECTS
        self.prefill[event.instance_id].start(event.request_id, event.now_s)
        admitted.phase = "prefilling"
        incoming = self.decode[admitted.decode_instance_id].incoming.get(event.request_id)
        if incoming is not None:
            incoming.ready_s = event.now_s + admitted.predicted_prefill_s
        return NO_EFFECTS

    def on_prefill_finished(self, event: ev.PrefillFinished) -> tuple[Effect, ...]:
        admitted = self._requests.get(event.request_id)
        if admitted is None or admitted.prefill_instance_id != event.instance_id:
            return NO_EFFECTS
        self.prefill[event.instance_id].finish(event.request_id, event.now_s, event.took_s)
        admitted.prefill_instance_id = None
        admitted.phase = "to_decode"
        decode_state = self.decode[admitted.decode_instance_id]
        incoming = decode_state.incoming.get(event.request_id)
        if incoming is not None:
            incoming.ready_s = event.now_s
        return (
            DispatchDecode(
                event.request_id,
                admitted.decode_instance_id,
                admitted.arrival.num_input_tokens,
                self._arrival_check(admitted.arrival),
            ),
        )

    def _arrival_check(self, arrival: ev.RequestArrived) -> ArrivalCheck | None:
        """The decode instance's check for this request under the configuration in force."""
        if not self.config.checks_decode_on_arrival:
            return None
        return ArrivalCheck(arrival.tbt_slo_s or self.config.tbt_slo_s, self.cost.decode)

    def on_decode_started(self, event: ev.DecodeStarted) -> tuple[Effect, ...]:
        admitted = self._requests.get(event.request_id)
        if admitted is None or admitted.decode_instance_id != event.instance_id:
            return NO_EFFECTS
        admitted.phase = "decoding"
        self.decode[event.instance_id].start(
            event.request_id, admitted.arrival.num_input_tokens, event.now_s
        )
        return NO_EFFECTS

    def on_decode_step(self, event: ev.DecodeStep) -> tuple[Effect, ...]:
        admitted = self._requests.get(event.request_id)
        if admitted is not None and admitted.phase == "decoding":
            context_tokens = admitted.arrival.num_input_tokens + event.num_generated_tokens
            self.decode[admitted.decode_instance_id].grow(event.request_id, context_tokens)
        return NO_EFFECTS

    def on_decode_finished(self, event: ev.DecodeFinished) -> tuple[Effect, ...]:
        admitted = self._requests.pop(event.request_id, None)
        if admitted is None:
            return NO_EFFECTS
        running = self.decode[admitted.decode_instance_id].finish(event.request_id)
        if running is not None:
            self._decode_times.add(
                event.now_s - running.started_s,
                event.num_generated_tokens,
                admitted.arrival.num_output_tokens,
            )
        return NO_EFFECTS

    def on_decode_rejected(self, event: ev.DecodeRejected) -> tuple[Effect, ...]:
        admitted = self._requests.pop(event.request_id, None)
        if admitted is not None:
            self.decode[admitted.decode_instance_id].finish(event.request_id)
        return NO_EFFECTS

    def on_request_failed(
        self, event: ev.RequestFailed | ev.RequestCancelled
    ) -> tuple[Effect, ...]:
        self._forget(event.request_id)
        return NO_EFFECTS

    # -- the pool -------------------------------------------------------------------------
    def on_kv_stored(self, event: ev.KvStored) -> tuple[Effect, ...]:
        if event.instance_id not in self.prefill and event.instance_id not in self.decode:
            return NO_EFFECTS  # a late event from an instance already gone
        self.index.on_stored(event.instance_id, event.keys, event.tier)
        if self.max_replicas is None:
            return NO_EFFECTS
        return plan_replica_cap(self.index, event.instance_id, event.keys, self.max_replicas)

    def on_kv_evicted(self, event: ev.KvEvicted) -> tuple[Effect, ...]:
        self.index.on_evicted(event.instance_id, event.keys)
        return NO_EFFECTS

    def on_kv_demoted(self, event: ev.KvDemoted) -> tuple[Effect, ...]:
        self.index.on_demoted(event.instance_id, event.keys)
        return NO_EFFECTS

    def on_kv_lost(self, event: ev.KvLost) -> tuple[Effect, ...]:
        self.index.drop_instance(event.instance_id)
        return NO_EFFECTS

    # -- membership -----------------------------------------------------------------------
    def on_agent_joined(self, event: ev.AgentJoined) -> tuple[Effect, ...]:
        effects: tuple[Effect, ...] = NO_EFFECTS
        other_role = self.decode if event.role == "prefill" else self.prefill
        if event.instance_id in other_role:  # a role switch: leave the old role first
            # Its KV blocks stay in its shard, so they stay in the index.
            left = ev.AgentLeft(event.now_s, event.instance_id, "role switch")
            effects = self._take_out(left, keep_blocks=True)
        if event.role == "prefill":
            prefill = self.prefill.setdefault(event.instance_id, PrefillState(event.instance_id))
            prefill.draining = False
        else:
            state = self.decode.setdefault(event.instance_id, DecodeState(event.instance_id))
            state.kv_capacity_tokens = event.kv_capacity_tokens
            state.draining = False
        return effects

    def on_agent_draining(self, event: ev.AgentDraining) -> tuple[Effect, ...]:
        state = self.prefill.get(event.instance_id) or self.decode.get(event.instance_id)
        if state is not None:
            state.draining = True
        return NO_EFFECTS

    def on_agent_left(self, event: ev.AgentLeft) -> tuple[Effect, ...]:
        """Take the instance out; re-route requests it had not started, fail those it had."""
        return self._take_out(event, keep_blocks=False)

    def on_transfer_measured(self, event: ev.TransferMeasured) -> tuple[Effect, ...]:
        """Believe the pair's link as fast as its fetches were (backend.policy.links)."""
        self.links.observe(
            event.source_instance_id,
            event.destination_instance_id,
            event.num_bytes,
            event.seconds,
            self.cost.link.latency_s,
        )
        return NO_EFFECTS

    def _take_out(self, event: ev.AgentLeft, *, keep_blocks: bool) -> tuple[Effect, ...]:
        if not keep_blocks:
            self.index.drop_instance(event.instance_id)
        self.links.forget(event.instance_id)
        prefill_state = self.prefill.pop(event.instance_id, None)
        decode_state = self.decode.pop(event.instance_id, None)
        failure = f"instance {event.instance_id} lost: {event.reason}"
        effects: list[Effect] = []
        to_reroute: list[_Admitted] = []
        if prefill_state is not None:
            for request_id in prefill_state.queued_s:
                admitted = self._forget(request_id)
                if admitted is not None:
                    to_reroute.append(admitted)
            for request_id in prefill_state.running:
                if self._forget(request_id) is not None:
                    effects.append(FailRequest(request_id, failure))
        if decode_state is not None:
            for request_id in decode_state.decoding:
                if self._forget(request_id) is not None:
                    effects.append(FailRequest(request_id, failure))
            for request_id, incoming in decode_state.incoming.items():
                if request_id not in self._requests:
                    continue
                open_decode = [s for s in self.decode.values() if not s.draining]
                if open_decode:  # its prefill goes on; its KV will go to another instance
                    admitted = self._requests[request_id]
                    target = choose_decode(
                        self.cost, open_decode, incoming.context_tokens, self.config.tbt_slo_s
                    )
                    target.add_incoming(
                        request_id,
                        incoming.context_tokens,
                        incoming.ready_s,
                        incoming.expected_s,
                        incoming.expected_tokens,
                    )
                    admitted.decode_instance_id = target.instance_id
                else:
                    self._forget(request_id)
                    effects.append(FailRequest(request_id, "no_decode_instance"))
        for admitted in to_reroute:
            effects.extend(self._place_again(admitted, event.now_s))
        return tuple(effects)

    def on_request_retried(self, event: ev.RequestRetried) -> tuple[Effect, ...]:
        admitted = self._forget(event.request_id)
        if admitted is None:
            return NO_EFFECTS
        return self._place_again(admitted, event.now_s)

    def _place_again(self, admitted: _Admitted, now_s: float) -> tuple[Effect, ...]:
        """Route and book an admitted request anew (it lost its instance), no admission."""
        retry = admitted.arrival
        rerouted = ev.RequestArrived(
            now_s,
            retry.request_id,
            retry.block_keys,
            retry.num_input_tokens,
            retry.num_output_tokens,
            retry.ttft_slo_s,
            retry.tbt_slo_s,
        )
        return self._place(rerouted, apply_admission=False)

    def _forget(self, request_id: str) -> _Admitted | None:
        """Drop a request from every queue and batch it is in (dead instances are gone)."""
        admitted = self._requests.pop(request_id, None)
        if admitted is None:
            return None
        if admitted.prefill_instance_id is not None:
            prefill_state = self.prefill.get(admitted.prefill_instance_id)
            if prefill_state is not None:
                prefill_state.finish(request_id)
        decode_state = self.decode.get(admitted.decode_instance_id)
        if decode_state is not None:
            decode_state.finish(request_id)
        return admitted

    def on_tick(self, event: ev.Tick) -> tuple[Effect, ...]:
        return NO_EFFECTS
