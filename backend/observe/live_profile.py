"""The live cluster as a twin profile: what a what-if replays a recorded window on.

A `kvcentric-profile/1` dict the twin reads like any measured profile, built from the
calibration window's measurements (the twin's ground truth, separate from what the policy
believes): prefill points on a grid from the robust fit of the measured prefills; decode
points as measured, the median step of every batch size seen often enough (beyond the
largest, grown from it as the starting profile's measurement of the model grows); in
`spread` the quantiles of each prefill's and each step's ratio to those central times and of
the serving path's dispatch, answer, first-token and prefill hand-over delays, which the
twin draws from (twin/spread.py); the joined agents' capacities; and in `believed` the cost
model the Conductor's policy ran with (its calibrated model, bounded per refit), so the
twin's policy believes what live did.

When every agent runs on one host, the times are first scaled back to what each would have
taken alone (backend/observe/host_share.py) and the profile says in `host` how many cores
the agents shared; the twin slows them again by how many of its agents compute at once,
decode steps and prefills at a share of a core drawn from what the window's steps and
prefills got at as many busy agents (`spread.decode_rate_N`, `spread.prefill_rate_N`; the
prefills' by their length where the window told lengths apart,
`spread.prefill_rate_N_from_Xms`).
A decode step's share falls with its length (`host.decode_length`: its `decode_rate_N`
are then the shares as at the reference length), and where the agents measured the decode
loop's pauses between steps, `spread.decode_pause_N` holds them by the number of other
agents computing meanwhile. Where the agents read their host's CPU counters, `host.other`
says what the rest of the host spent meanwhile (`host_share.host_other`), which the twin
scales with its own prefills a second.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from backend.observe.host_share import (
    NUM_QUANTILES,
    HostShare,
    PrefillClass,
    host_other,
    host_share,
    weighted_quantiles,
)
from backend.policy.calibration import (
    CalibrationConfig,
    Calibrator,
    DecodeStepSample,
    PrefillSample,
)
from backend.policy.cost_model import (
    PROFILE_FORMAT,
    CostModel,
    DecodeFit,
    LinkModel,
    PrefillFit,
    fit_decode,
    fit_prefill,
)
from backend.rpc.reports import Join

MIN_STEPS_PER_BATCH = 5  # a batch size measured less often takes the fit's times
MIN_POINTS_PER_RATE = 20  # decode steps or prefills at one busy count for its quantiles
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
CONTEXT_PER_REQUEST_TOKENS = (16, 64, 256, 1024, 4096)
MIN_FETCHES = 10  # in the window, to fit the link's latency and bandwidth from
MAX_FETCHES = 400  # the newest, for the fit (its pairs grow as the square)
MIN_FETCH_SIZE_RATIO = 2.0  # largest over smallest fetch, to tell latency from bandwidth


def live_profile(
    calibrator: Calibrator,
    agents: Sequence[Join],
    *,
    name: str = "live",
    links: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The profile of the cluster the calibration window measured; see the module docstring.
    `links`: the Conductor's measured pairs (`LinkEstimates.snapshot()`)."""
    believed = calibrator.cost
    config = calibrator.config
    share = _one_host_share(calibrator, agents)
    samples = Samples(
        prefill=list(share.prefill if share else calibrator.prefill),
        decode=list(share.decode if share else calibrator.decode),
        min_prefill=config.min_prefill_points,
        min_decode=config.min_decode_points,
    )
    prefill, prefill_source = _window_prefill(samples, believed.prefill)
    decode, decode_source = _window_decode(samples, believed.decode)
    # Rows of one cached length each, over new tokens (how MeasuredTiming interpolates):
    # every row holds the same new-token grid, so no row is a lone point.
    largest_input = max((s.input_tokens for s in samples.prefill), default=4096)
    grid = sorted({max(1, round(largest_input * 2 * 0.5**k)) for k in range(10)})
    prefill_points = [
        {"input_tokens": c + n, "cached_tokens": c, "seconds": prefill.time_s(c + n, c)}
        for c in [0, *grid]
        for n in grid
    ]
    measured_steps = _steps_by_batch(samples.decode)
    decode_points = [
        {"batch_size": b, "context_tokens": context, "seconds": seconds}
        for b, steps in measured_steps.items()
        for context, seconds in _row(steps, decode.per_context_token_s)
    ]
    largest_batch = max(measured_steps, default=0)
    beyond = _beyond_measured(measured_steps, decode, calibrator.base.decode)
    decode_points += [
        {"batch_size": b, "context_tokens": b * c, "seconds": beyond(b, b * c)}
        for b in BATCH_SIZES
        if b > largest_batch
        for c in CONTEXT_PER_REQUEST_TOKENS
    ]
    prefill_agents = [a for a in agents if a.role == "prefill"] or list(agents)
    decode_agents = [a for a in agents if a.role == "decode"] or list(agents)
    link, link_source = _measured_link(believed, calibrator.prefill, links)
    profile = {
        "format": PROFILE_FORMAT,
        "name": name,
        "kv_bytes_per_token": believed.kv_bytes_per_token,
        "instance": {
            "dram_capacity_bytes": min((a.dram_capacity_bytes for a in prefill_agents), default=0),
            "ssd_capacity_bytes": min((a.ssd_capacity_bytes for a in prefill_agents), default=0),
            "decode_kv_capacity_tokens": min(
                (a.kv_capacity_tokens for a in decode_agents), default=0
            ),
        },
        "link": {"bandwidth_bytes_per_s": link.bandwidth_bytes_per_s, "latency_s": link.latency_s},
        "prefill_points": prefill_points,
        "decode_points": decode_points,
        "serving": _serving(calibrator),
        "spread": _spread(calibrator, samples, prefill, measured_steps, share),
        "believed": believed.to_profile(),
        "measured_from": {
            "prefill": prefill_source,
            "decode": decode_source,
            "link": link_source,
            "num_prefill_samples": len(calibrator.prefill),
            "num_decode_samples": len(calibrator.decode),
            "num_serving_samples": len(calibrator.serving),
        },
    }
    if share is not None:
        profile["host"] = {
            "cores": share.cores,
            "prefill_cores": share.prefill_cores,
            "decode_cores": share.decode_cores,
            "mean_busy_agents": round(share.mean_busy_agents, 3),
        }
        if share.decode_length is not None:
            profile["host"]["decode_length"] = {
                "reference_s": share.decode_length.reference_s,
                "exponent": share.decode_length.exponent,
            }
        other = host_other(
            calibrator.host_cpu,
            calibrator.prefill,
            calibrator.decode,
            min_prefill_points=config.min_prefill_points,
        )
        if other is not None:
            profile["host"]["other"] = asdict(other)
    return profile


def profile_inputs(
    calibrator: Calibrator, agents: Sequence[Join], links: Sequence[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    """Everything `live_profile` reads, JSON-ready: the starting model, the calibration's
    settings, its window (every sample), the joined agents and the measured links. Kept
    with a validate run, it lets a later twin build the profile again (`profile_of_inputs`)
    and so judge a change to how profiles are built on windows already measured."""
    return {
        "base": calibrator.base.to_profile(),
        "config": asdict(calibrator.config),
        "window": calibrator.to_state(max_samples=calibrator.config.max_samples),
        "agents": [asdict(agent) for agent in agents],
        "links": [dict(link) for link in links],
    }


def profile_of_inputs(inputs: Mapping[str, Any], *, name: str = "live") -> dict[str, Any]:
    """The live profile of a `profile_inputs()`, built by this code; ValueError when they
    are malformed."""
    try:
        calibrator = Calibrator(
            CostModel.from_profile(inputs["base"]), CalibrationConfig.from_json(inputs["config"])
        )
        agents = [Join(**agent) for agent in inputs["agents"]]
        links = list(inputs.get("links", []))
        window = inputs["window"]
    except (KeyError, TypeError) as error:
        raise ValueError(f"the live profile's inputs are malformed: {error}") from None
    calibrator.restore(window)
    return live_profile(calibrator, agents, name=name, links=links)


# Between one run's samples and the next run's, when several warm-ups are pooled: longer
# than any computation, so no interval of one run overlaps another's.
POOL_GAP_S = 600.0


def pooled_inputs(
    own: Mapping[str, Any],
    others: Sequence[Mapping[str, Any]],
    slower: Sequence[float] = (),
) -> dict[str, Any]:
    """`own`'s profile inputs with the prefills, decode steps and serving delays of
    `others` (inputs of the same configuration's other runs, measured over the same stretch
    of the trace) added to its window, each run's moved in time to after the one before so
    that no run's computations overlap another's: the host's sharing is then measured
    within each run, over all of them. Everything else is `own`'s: the Conductor's beliefs,
    the starting model, the agents, the links, and the host's CPU counters, so the rest of
    the host (`host.other`) is still the one `own`'s run measured.

    A short warm-up measures a decode step's share of a core, and how it falls with the
    step's length, from a few hundred steps (at speed 10, 6 seconds): run to run that slope
    spread 0.04-0.19 on one machine, and the twin's TBT followed it. Several runs' warm-ups
    of one configuration measure the same thing as one longer warm-up would.

    `slower[i]`: how much slower `own`'s host ran than `others[i]`'s (their speeds'
    ratio, `host_speed.relative_speeds`): that run's computations are stretched by it,
    their clocks and spans alike, so the pool keeps the shares and shapes of every run at
    `own`'s speed (the host's speed moved by up to 30 % between runs minutes apart)."""
    window = dict(own["window"])
    kinds = ("prefill", "decode", "serving")
    pooled = {kind: list(window.get(kind, [])) for kind in kinds}
    end_s = _last_time_s(pooled)
    for number, other in enumerate(others):
        theirs = {kind: list(other["window"].get(kind, [])) for kind in kinds}
        start_s = _first_time_s(theirs)
        if start_s is None:
            continue
        if number < len(slower) and slower[number] != 1.0:
            theirs = _stretched(theirs, start_s, slower[number])
        shift_s = (end_s if end_s is not None else start_s) + POOL_GAP_S - start_s
        for kind in kinds:
            pooled[kind] += [{**s, "time_s": s["time_s"] + shift_s} for s in theirs[kind]]
        end_s = _last_time_s(pooled)
    window.update(pooled)
    # The counters `host_other` reads for `own` alone: those within its prefills' span.
    prefills = own["window"].get("prefill", [])
    if prefills:
        first_s = min(s["time_s"] - max(float(s["seconds"]), 0.0) for s in prefills)
        last_s = max(s["time_s"] for s in prefills)
        window["host_cpu"] = [
            s for s in window.get("host_cpu", []) if first_s <= s["time_s"] <= last_s
        ]
    config = dict(own["config"])
    config["max_samples"] = max(int(config.get("max_samples", 0)), *map(len, pooled.values()))
    return {**own, "config": config, "window": window}


def _stretched(
    samples: Mapping[str, list[dict[str, Any]]], start_s: float, factor: float
) -> dict[str, list[dict[str, Any]]]:
    """`samples` on a clock running `factor` times slower from `start_s`, the prefills' and
    decode steps' wall and CPU times `factor` times longer (serving samples have neither)."""

    def at(sample: Mapping[str, Any]) -> dict[str, Any]:
        stretched = {**sample, "time_s": start_s + (sample["time_s"] - start_s) * factor}
        for key in ("seconds", "cpu_s"):
            if stretched.get(key) is not None:
                stretched[key] = stretched[key] * factor
        return stretched

    return {kind: [at(s) for s in kind_samples] for kind, kind_samples in samples.items()}


def _first_time_s(samples: Mapping[str, Sequence[Mapping[str, Any]]]) -> float | None:
    return min(
        (s["time_s"] - max(float(s.get("seconds", 0.0)), 0.0) for k in samples.values() for s in k),
        default=None,
    )


def _last_time_s(samples: Mapping[str, Sequence[Mapping[str, Any]]]) -> float | None:
    return max((s["time_s"] for kind in samples.values() for s in kind), default=None)


@dataclass(frozen=True, slots=True)
class ProfilePart:
    """Where one part of a live profile lies: its top-level keys, its keys in `host` and in
    `spread` (a key ending in "_" names every spread key it begins)."""

    keys: tuple[str, ...] = ()
    host: tuple[str, ...] = ()
    spread: tuple[str, ...] = ()

    def holds_spread(self, key: str) -> bool:
        return any(key.startswith(n) if n.endswith("_") else key == n for n in self.spread)


# The parts `with_parts` can take from another profile (`kvcentric twin repredict
# --hindsight-of`): the prefills' and decode steps' times with their shares of the host and
# their spread, the rest of the host (`host.other`, the agents' cores overall), the serving
# path's delays, the link.
PROFILE_PARTS: dict[str, ProfilePart] = {
    "prefill": ProfilePart(("prefill_points",), ("prefill_cores",), ("prefill_", "handover_s")),
    "decode": ProfilePart(("decode_points",), ("decode_cores", "decode_length"), ("decode_",)),
    "host": ProfilePart(host=("other", "cores", "mean_busy_agents")),
    "serving": ProfilePart(("serving",), spread=("dispatch_s", "first_token_s", "answer_s")),
    "link": ProfilePart(("link",)),
}


def check_parts(parts: Sequence[str]) -> None:
    """ValueError naming the first of `parts` that PROFILE_PARTS does not know."""
    unknown = [name for name in parts if name not in PROFILE_PARTS]
    if unknown:
        raise ValueError(
            f"unknown profile part {unknown[0]!r}; the parts are {', '.join(PROFILE_PARTS)}"
        )


def with_parts(
    profile: Mapping[str, Any], source: Mapping[str, Any], parts: Sequence[str]
) -> dict[str, Any]:
    """`profile` with the named `parts` (PROFILE_PARTS) as `source` has them, a key `source`
    lacks left out: a prediction from the warm-up's profile given, say, the window's decode
    measurements alone says how much of its error those measurements carry. ValueError
    naming an unknown part."""
    check_parts(parts)
    merged = {**profile, "host": dict(profile.get("host", {})), "spread": {}}
    spread = dict(profile.get("spread", {}))
    for part in (PROFILE_PARTS[name] for name in parts):
        for key in part.keys:
            _take(merged, source, key)
        for key in part.host:
            _take(merged["host"], source.get("host", {}), key)
        spread = {k: v for k, v in spread.items() if not part.holds_spread(k)}
        spread.update((k, v) for k, v in source.get("spread", {}).items() if part.holds_spread(k))
    merged["spread"] = spread
    for key in ("host", "spread"):
        if not merged[key] and key not in profile:
            del merged[key]
    return merged


def _take(into: dict[str, Any], source: Mapping[str, Any], key: str) -> None:
    if key in source:
        into[key] = source[key]
    else:
        into.pop(key, None)


def _measured_link(
    believed: CostModel, prefill: Sequence[PrefillSample], links: Sequence[Mapping[str, Any]]
) -> tuple[LinkModel, str]:
    """The link the window's fetches measured (`_link_of_fetches`); without any, the median
    bandwidth of the Conductor's measured pairs (agents that do not report a fetch's
    seconds), else the believed link. At speed 8 on one 2-CPU host a 10-block fetch took
    4.3 ms where the idle profile's link (3.2 GB/s, 0.14 ms) says 0.24 ms; a twin on the
    latter fetched 15x faster than live and replicated 67 % more blocks."""
    fetched = _link_of_fetches(believed.link, believed.kv_bytes_per_token, prefill)
    if fetched is not None:
        return fetched
    bandwidths = [
        float(row["bandwidth_bytes_per_s"])
        for row in links
        if row.get("bandwidth_bytes_per_s") and int(row.get("num_measurements", 0)) > 0
    ]
    if not bandwidths:
        return believed.link, "believed"
    measured = replace(believed.link, bandwidth_bytes_per_s=float(np.median(bandwidths)))
    return measured, f"{len(bandwidths)} measured pair(s)"


def _link_of_fetches(
    believed: LinkModel, kv_bytes_per_token: int, prefill: Sequence[PrefillSample]
) -> tuple[LinkModel, str] | None:
    """seconds = latency + bytes / bandwidth through the window's fetches (each prefill's
    `fetch_s` and fetched bytes); None without a fetch.

    With MIN_FETCHES of sizes apart enough, both terms by Theil-Sen (the median of the
    pairwise slopes; the latency the median of what is left). With fewer, or where size
    does not show in the seconds, only the latency is measured (the median of each fetch's
    seconds beyond its bytes at the believed bandwidth): a per-fetch cost must not pass for
    a slow link. Dividing each fetch's seconds by its bytes, as the pairs' estimates do,
    folds the per-fetch costs (the call, the threads on a crowded host) into the bandwidth,
    which then swings with the sizes fetched: two runs of one configuration at speed 8,
    each with one or two fetches in the warm-up, believed 8.8 and 135 MB/s, and a twin on
    the first fetched long prefixes for most of a second and refused 45-68 requests where
    live refused 19 (most fetches there took 0.5-5 ms at any size up to 3 MB)."""
    fetches = [
        (s.fetched_tokens * kv_bytes_per_token, s.fetch_s)
        for s in prefill
        if s.fetched_tokens > 0 and s.fetch_s > 0
    ][-MAX_FETCHES:]
    if not fetches:
        return None
    sizes = np.array([f[0] for f in fetches], dtype=float)
    seconds = np.array([f[1] for f in fetches], dtype=float)
    if len(fetches) >= MIN_FETCHES and sizes.max() >= MIN_FETCH_SIZE_RATIO * sizes.min():
        first, second = np.triu_indices(len(sizes), 1)
        apart = sizes[second] != sizes[first]
        rise = (seconds[second] - seconds[first])[apart]
        per_byte_s = float(np.median(rise / (sizes[second] - sizes[first])[apart]))
        if per_byte_s > 0:
            latency_s = max(0.0, float(np.median(seconds - per_byte_s * sizes)))
            link = replace(believed, bandwidth_bytes_per_s=1.0 / per_byte_s, latency_s=latency_s)
            return link, f"{len(fetches)} fetches fitted"
    beyond = seconds - sizes / believed.bandwidth_bytes_per_s
    link = replace(believed, latency_s=max(0.0, float(np.median(beyond))))
    return link, f"{len(fetches)} fetch(es): latency measured, bandwidth believed"


@dataclass(frozen=True, slots=True)
class Samples:
    """The window's measurements the profile is built from (at solo times on one host)."""

    prefill: list[PrefillSample]
    decode: list[DecodeStepSample]
    min_prefill: int
    min_decode: int


def _one_host_share(calibrator: Calibrator, agents: Sequence[Join]) -> HostShare | None:
    """Host sharing when every agent's control address names the same host (loopback or
    one address); agents across hosts do not slow each other, and are not modelled so."""
    hosts = {join.control_address.rpartition(":")[0] for join in agents}
    if len(hosts) != 1:
        return None
    return host_share(
        list(calibrator.prefill),
        list(calibrator.decode),
        num_agents=len(agents),
        min_prefill_points=calibrator.config.min_prefill_points,
    )


def _window_prefill(samples: Samples, believed: PrefillFit) -> tuple[PrefillFit, str]:
    if len(samples.prefill) < samples.min_prefill:
        return believed, "believed model (too few measurements)"
    points = [(s.input_tokens, s.cached_tokens, s.seconds) for s in samples.prefill]
    return fit_prefill(points, robust=True), "window fit"


def _window_decode(samples: Samples, believed: DecodeFit) -> tuple[DecodeFit, str]:
    if len(samples.decode) < samples.min_decode:
        return believed, "believed model (too few measurements)"
    points = [(s.batch_size, s.context_tokens, s.seconds) for s in samples.decode]
    return fit_decode(points, robust=True), "window fit"


def _serving(calibrator: Calibrator) -> dict[str, float]:
    serving = calibrator.cost.serving
    return {
        "dispatch_s": serving.dispatch_s,
        "first_token_s": serving.first_token_s,
        "per_token_s": serving.per_token_s,
        "answer_s": serving.answer_s,
        "handover_s": serving.handover_s,
    }


def _steps_by_batch(samples: Sequence[DecodeStepSample]) -> dict[int, list[tuple[int, float]]]:
    """(context tokens, seconds) of the measured steps of every batch size seen often."""
    steps: dict[int, list[tuple[int, float]]] = {}
    for sample in samples:
        steps.setdefault(sample.batch_size, []).append((sample.context_tokens, sample.seconds))
    return {b: v for b, v in sorted(steps.items()) if len(v) >= MIN_STEPS_PER_BATCH}


def _row(steps: list[tuple[int, float]], per_context_token_s: float) -> list[tuple[int, float]]:
    """A batch size's measured row: its median step at its median context, and the window
    fit's slope over context (a batch size's own contexts span too little to give one)."""
    context = int(np.median([c for c, _ in steps]))
    seconds = float(np.median([t for _, t in steps]))
    return [(context, seconds), (context + 1024, seconds + 1024 * per_context_token_s)]


def _beyond_measured(
    steps: dict[int, list[tuple[int, float]]], window: DecodeFit, base: DecodeFit
) -> Callable[[int, int], float]:
    """Step times of batches larger than the window measured: the largest measured batch's
    time, grown as the starting profile's own measurement of this model grows with batch and
    context. The window's linear fit is dominated by the small batches a window holds most
    and grows too fast: measured at speed 8 on 2 CPUs, batches 1-5 fitted 2.0 ms per request,
    while steps of 8 requests took 14 ms of CPU, not the fit's 24 ms."""
    if not steps:
        return window.step_s
    largest = max(steps)
    context, seconds = _row(steps[largest], window.per_context_token_s)[0]
    at_largest = base.step_s(largest, context)
    if not (seconds > 0 and at_largest > 0):
        return window.step_s
    scale = seconds / at_largest
    return lambda batch_size, context_tokens: scale * base.step_s(batch_size, context_tokens)


def _spread(
    calibrator: Calibrator,
    samples: Samples,
    prefill: PrefillFit,
    steps: dict[int, list[tuple[int, float]]],
    share: HostShare | None,
) -> dict[str, list[float]]:
    """Quantiles of the measured variation (see the module docstring); parts with too few
    measurements are left out (the twin then runs them at their central times)."""
    spread: dict[str, list[float]] = {}
    if len(samples.prefill) >= samples.min_prefill:
        factors = [
            s.seconds / central
            for s in samples.prefill
            if (central := prefill.time_s(s.input_tokens, s.cached_tokens)) > 0
        ]
        spread["prefill_factor"] = _quantiles(factors)
    if steps:
        factors = [
            t / median
            for v in steps.values()
            for median in [float(np.median([t for _, t in v]))]
            for _, t in v
        ]
        spread["decode_factor"] = _quantiles(factors)
    if len(calibrator.serving) >= calibrator.config.min_serving_points:
        spread["dispatch_s"] = _quantiles([s.dispatch_s for s in calibrator.serving])
        spread["first_token_s"] = _quantiles([s.first_token_s for s in calibrator.serving])
        answers = [s.answer_s for s in calibrator.serving if s.answer_s is not None]
        if len(answers) >= calibrator.config.min_serving_points:
            spread["answer_s"] = _quantiles(answers)
    handovers = [s.handover_s for s in calibrator.prefill if s.handover_s is not None]
    if len(handovers) >= calibrator.config.min_serving_points:
        spread["handover_s"] = _quantiles(handovers)
    if share is not None:  # the share of a core decode steps and prefills got, by busy agents
        for busy_agents, rates in share.decode_rates.items():
            if len(rates) >= MIN_POINTS_PER_RATE:
                spread[f"decode_rate_{busy_agents}"] = _quantiles(list(rates))
        spread |= _prefill_rates(share)
        for others_busy, pauses in share.decode_pauses.items():
            if len(pauses) >= MIN_POINTS_PER_RATE:
                spread[f"decode_pause_{others_busy}"] = _quantiles(list(pauses))
    return spread


def _prefill_rates(share: HostShare) -> dict[str, list[float]]:
    """The prefills' shares of a core by busy count, weighted by each prefill's work
    (host_share.prefill_rates_by_busy): `prefill_rate_N` of all prefills, or, where the
    window held enough to tell lengths apart, of the shortest class, and
    `prefill_rate_N_from_Xms` of the prefills of X ms of CPU or more
    (host_share.prefill_rates_by_length)."""
    classes = [
        c
        for c in share.prefill_classes
        if c.rates and min(map(len, c.rates.values())) >= MIN_POINTS_PER_RATE
    ]
    if len(classes) < 2 or classes[0].from_s > 0:
        classes = [PrefillClass(0.0, share.prefill_rates, share.prefill_rate_weights)]
    spread = {}
    for prefill_class in classes:
        from_ms = round(prefill_class.from_s * 1000.0, 1)
        suffix = f"_from_{from_ms:g}ms" if from_ms > 0 else ""
        for busy_agents, rates in prefill_class.rates.items():
            if len(rates) >= MIN_POINTS_PER_RATE:
                spread[f"prefill_rate_{busy_agents}{suffix}"] = _quantiles(
                    list(rates), prefill_class.weights
                )
    return spread


def _quantiles(values: Sequence[float], weights: Sequence[float] = ()) -> list[float]:
    """NUM_QUANTILES evenly spaced quantiles of `values`; with `weights` (one per value), of
    the distribution where each value counts by its weight (each at the middle of its
    weight's stretch of the cumulative sum, linear between)."""
    values = np.maximum(np.asarray(values, dtype=float), 0.0)
    positions = np.linspace(0, 1, NUM_QUANTILES)
    if len(weights) == 0 or not np.sum(weights) > 0:
        return [float(v) for v in np.quantile(values, positions)]
    weighted = weighted_quantiles(values, np.asarray(weights, dtype=float), NUM_QUANTILES)
    return [float(v) for v in weighted]
