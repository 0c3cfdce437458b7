"""ConductorMetrics: what the Conductor counts about requests, decisions, rejections, cache
reuse and instance loads, named as in the twin's report (docs/fidelity.md).

The runtime calls one method per event (`record_decision`, `record_rejection`,
`record_outcome`, `observe_ttft`, ...); `/metrics` serves `render()`. Rejections and
outcomes are counted apart on purpose: `record_rejection` counts every Reject by reason and
stage, `record_outcome` counts every terminal request once by state (a rejected request is
counted by both).
"""

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from backend.policy.effects import DispatchPrefill, Reject, Replicate
from backend.rpc.reports import AgentLoad

# TTFT: 10 ms to 120 s; TBT: 1 ms to 1 s (seconds, roughly x2 steps).
TTFT_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0,
)  # fmt: skip
TBT_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0,
)  # fmt: skip

_PREFIX = "kvcentric"


class ConductorMetrics:
    """The Conductor's metrics in a registry of their own (`registry`)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, *, block_size: int, scheduler: str = "") -> None:
        if block_size <= 0:
            raise ValueError(f"block size must be positive, got {block_size}")
        self.block_size = block_size
        self.scheduler = scheduler  # the label of decisions when the call names none
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests_submitted = Counter(
            f"{_PREFIX}_requests_submitted", "Requests received, by endpoint.", ["endpoint"],
            registry=r,
        )  # fmt: skip
        self.requests_accepted = Counter(
            f"{_PREFIX}_requests_accepted", "Requests admitted, by endpoint.", ["endpoint"],
            registry=r,
        )  # fmt: skip
        self.requests_terminal = Counter(
            f"{_PREFIX}_requests_terminal",
            "Requests that reached a terminal state, by state, reason and stage.",
            ["state", "reason", "stage"],
            registry=r,
        )
        self.rejections = Counter(
            f"{_PREFIX}_rejections", "Rejections, by reason and stage.", ["reason", "stage"],
            registry=r,
        )  # fmt: skip
        self.decisions = Counter(
            f"{_PREFIX}_decisions",
            "Prefill dispatch decisions, by scheduler and branch (local or transfer).",
            ["scheduler", "branch"],
            registry=r,
        )
        self.input_tokens = Counter(
            f"{_PREFIX}_input_tokens", "Prompt tokens of dispatched requests.", registry=r
        )
        self.reused_tokens = Counter(
            f"{_PREFIX}_reused_tokens",
            "Prefix tokens reused from the pool (hit ratio = reused / input).",
            registry=r,
        )
        self.transferred_tokens = Counter(
            f"{_PREFIX}_transferred_tokens",
            "Prefix tokens fetched from another instance's shard.",
            registry=r,
        )
        self.prefill_tokens = Counter(
            f"{_PREFIX}_prefill_tokens", "Tokens computed by prefills.", registry=r
        )
        self.replications = Counter(
            f"{_PREFIX}_replications", "Replications (hot-spot migrations) ordered.", registry=r
        )
        self.replicated_blocks = Counter(
            f"{_PREFIX}_replicated_blocks", "Blocks copied by replications.", registry=r
        )
        self.ttft = Histogram(
            f"{_PREFIX}_ttft_seconds", "Time to first token.", buckets=TTFT_BUCKETS_S,
            registry=r,
        )  # fmt: skip
        self.tbt = Histogram(
            f"{_PREFIX}_tbt_seconds", "Time between tokens, every gap.", buckets=TBT_BUCKETS_S,
            registry=r,
        )  # fmt: skip
        labels = ["instance_id", "role"]
        self.prefill_queued_requests = Gauge(
            f"{_PREFIX}_instance_prefill_queued_requests",
            "Prefill requests waiting on an instance.", labels, registry=r,
        )  # fmt: skip
        self.prefill_queued_tokens = Gauge(
            f"{_PREFIX}_instance_prefill_queued_tokens",
            "Prompt tokens waiting or running on a prefill instance.", labels, registry=r,
        )  # fmt: skip
        self.decode_batch_size = Gauge(
            f"{_PREFIX}_instance_decode_batch_size",
            "Requests in an instance's decode batch.", labels, registry=r,
        )  # fmt: skip
        self.decode_context_tokens = Gauge(
            f"{_PREFIX}_instance_decode_context_tokens",
            "Context tokens in an instance's decode batch.", labels, registry=r,
        )  # fmt: skip
        self.decode_predicted_tbt = Gauge(
            f"{_PREFIX}_instance_decode_predicted_tbt_seconds",
            "An instance's predicted TBT.", labels, registry=r,
        )  # fmt: skip
        self._load_gauges = (
            self.prefill_queued_requests,
            self.prefill_queued_tokens,
            self.decode_batch_size,
            self.decode_context_tokens,
            self.decode_predicted_tbt,
        )
        self._instance_roles: dict[str, str] = {}
        # What the Conductor's load sampler sees (one value per instance, every tick): the
        # pool loads the console and the twin plot, and how long since each agent spoke.
        self.instance_load = Gauge(
            f"{_PREFIX}_instance_load",
            "Load of an instance as the policy sees it: prefill T_queue over the TTFT SLO, "
            "decode max(predicted TBT over its SLO, KV memory share); 1.0 is at the SLO.",
            labels, registry=r,
        )  # fmt: skip
        self.instance_heartbeat_age = Gauge(
            f"{_PREFIX}_instance_heartbeat_age_seconds",
            "Seconds since the instance's last heartbeat.", labels, registry=r,
        )  # fmt: skip
        self.slo_seconds = Gauge(
            f"{_PREFIX}_slo_seconds", "The SLOs in force, by kind (ttft, tbt).", ["kind"],
            registry=r,
        )  # fmt: skip
        self.reachable_tokens = Counter(
            f"{_PREFIX}_reachable_tokens",
            "Prompt tokens of dispatched requests that the longest cached prefix on any prefill "
            "instance covered (the hit ratio the pool could reach).", registry=r,
        )  # fmt: skip
        self.calibration_refits = Gauge(
            f"{_PREFIX}_calibration_refits", "Refits of the cost model so far.", registry=r
        )
        self.calibration_error = Gauge(
            f"{_PREFIX}_calibration_median_rel_error",
            "Median |believed - measured| / measured over the calibration window, by kind "
            "(prefill, decode).", ["kind"], registry=r,
        )  # fmt: skip

        self.link_bandwidth = Gauge(
            f"{_PREFIX}_link_bandwidth_bytes_per_second",
            "KV bandwidth the policy believes from a source instance to a prefill instance, "
            "measured from their fetches.", ["source", "destination"], registry=r,
        )  # fmt: skip

    # -- requests ------------------------------------------------------------------------
    def record_submitted(self, endpoint: str) -> None:
        self.requests_submitted.labels(endpoint).inc()

    def record_accepted(self, endpoint: str) -> None:
        self.requests_accepted.labels(endpoint).inc()

    def record_outcome(self, state: str, *, reason: str = "", stage: str = "") -> None:
        """One terminal request: state completed/rejected/failed, with its reason and stage."""
        self.requests_terminal.labels(state, reason, stage).inc()

    def record_rejection(self, reject: Reject) -> None:
        self.rejections.labels(reject.reason, reject.stage).inc()

    # -- decisions and cache -------------------------------------------------------------
    def record_decision(self, dispatch: DispatchPrefill, *, scheduler: str | None = None) -> None:
        """One prefill dispatch: its branch, and its reused/transferred/computed tokens."""
        plan = dispatch.plan
        branch = "transfer" if plan.fetch is not None and plan.fetch.keys else "local"
        self.decisions.labels(self.scheduler if scheduler is None else scheduler, branch).inc()
        self.input_tokens.inc(plan.num_reused_tokens + plan.num_compute_tokens)
        reachable_blocks = max((c.prefix_blocks for c in dispatch.candidates), default=0)
        self.reachable_tokens.inc(reachable_blocks * self.block_size)
        self.reused_tokens.inc(plan.num_reused_tokens)
        self.prefill_tokens.inc(plan.num_compute_tokens)
        if plan.fetch is not None:
            self.transferred_tokens.inc(len(plan.fetch.keys) * self.block_size)

    def record_replication(self, replicate: Replicate) -> None:
        self.replications.inc()
        self.replicated_blocks.inc(len(replicate.keys))

    # -- latencies -----------------------------------------------------------------------
    def observe_ttft(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def observe_tbt(self, seconds: float) -> None:
        self.tbt.observe(seconds)

    # -- instance loads ------------------------------------------------------------------
    def set_instance_load(self, instance_id: str, role: str, load: AgentLoad) -> None:
        """The latest load an instance reported (heartbeat or GetState)."""
        previous = self._instance_roles.get(instance_id)
        if previous is not None and previous != role:
            self.remove_instance(instance_id)  # a role switch: drop the old series
        self._instance_roles[instance_id] = role
        self.prefill_queued_requests.labels(instance_id, role).set(load.num_queued)
        self.prefill_queued_tokens.labels(instance_id, role).set(load.queued_tokens)
        self.decode_batch_size.labels(instance_id, role).set(load.batch_size)
        self.decode_context_tokens.labels(instance_id, role).set(load.context_tokens)
        self.decode_predicted_tbt.labels(instance_id, role).set(load.predicted_tbt_s)

    def set_pool_sample(
        self,
        loads: dict[tuple[str, str], float],
        heartbeat_ages_s: dict[tuple[str, str], float],
        *,
        ttft_slo_s: float,
        tbt_slo_s: float,
    ) -> None:
        """One tick of the load sampler: each (instance_id, role)'s load and heartbeat age."""
        for (instance_id, role), load in loads.items():
            self._instance_roles.setdefault(instance_id, role)
            self.instance_load.labels(instance_id, role).set(load)
        for (instance_id, role), age_s in heartbeat_ages_s.items():
            self._instance_roles.setdefault(instance_id, role)
            self.instance_heartbeat_age.labels(instance_id, role).set(age_s)
        self.slo_seconds.labels("ttft").set(ttft_slo_s)
        self.slo_seconds.labels("tbt").set(tbt_slo_s)

    def set_calibration(
        self, num_refits: int, prefill_error: float | None, decode_error: float | None
    ) -> None:
        self.calibration_refits.set(num_refits)
        for kind, error in (("prefill", prefill_error), ("decode", decode_error)):
            if error is not None:
                self.calibration_error.labels(kind).set(error)

    def set_links(self, rows: list[dict[str, object]]) -> None:
        """The measured pairs now (backend.policy.links snapshot); pairs gone are dropped,
        pairs measured faster than the latency leaves room for are not shown."""
        self.link_bandwidth.clear()
        for row in rows:
            bandwidth = row["bandwidth_bytes_per_s"]
            if isinstance(bandwidth, float):
                self.link_bandwidth.labels(row["source"], row["destination"]).set(bandwidth)

    def remove_instance(self, instance_id: str) -> None:
        """Forget an instance that left, so its last load is not reported forever."""
        role = self._instance_roles.pop(instance_id, None)
        if role is None:
            return
        for gauge in (*self._load_gauges, self.instance_load, self.instance_heartbeat_age):
            with contextlib.suppress(KeyError):  # a gauge the instance never had a value in
                gauge.remove(instance_id, role)

    # -- exposition ----------------------------------------------------------------------
    def render(self) -> bytes:
        """The Prometheus text exposition of every metric above."""
        return generate_latest(self.registry)
