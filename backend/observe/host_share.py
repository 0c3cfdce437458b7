"""Agents sharing one host: how much they slowed each other, and the solo times beneath.

On one machine the agents' compute threads share its cores (with the Conductor and the
clients beside them). Measured on a two-core machine with three agents, a 211-token prefill
took 25 ms alone and 50-180 ms in a replay: the times the calibration window holds are
mostly the crowding, and how crowded a window is depends on its load and on the P:D
split, which is what a what-if changes.

The model is processor sharing: while n agents compute at once, each progresses at
min(1, cores / n), `cores` being what the agents get of the host's CPUs. From the
measurements' own intervals (every prefill and every decode step ends at its `time_s`
and lasts its `seconds`) this module counts how many agents computed at every moment.

Where the agents measured the CPU time each computation got (`cpu_s`, their computing
thread's clock: all of a prefill's and a decode step's work runs on one thread with one
torch thread per agent on a shared host), that is its solo time, and `cores` is the value
under which processor sharing over the counted intervals gives the same total work as the
CPU clocks did; each role gets its own value the same way (the scheduler does not share
the cores equally: on a 2-CPU host a decode loop kept 74 % of its steps' time on CPU
beside prefills that kept 49 %). Otherwise (agents that do not measure it) `cores` is the
value under which the measurements, scaled back to solo times, agree best with one prefill
model (the least spread of their residuals); at a steadily crowded host that choice is
weakly determined (two windows of one replay gave 1.1 and 3.0 cores), which is why the
agents measure.

The twin runs the solo times and slows them by the same rule with its own count of busy
agents (twin/host.py), so a change that crowds the host more is predicted to run slower.
"""

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from backend.policy.calibration import DecodeStepSample, HostCpuSample, PrefillSample
from backend.policy.cost_model import fit_prefill, prefill_columns

CORES_STEP = 0.05
MIN_CORES = 0.5
MAX_OVERFULL_SHARE = 0.1
# How much less spread (relative, and absolute in log units) fewer cores must give.
MIN_IMPROVEMENT = 0.005
MIN_IMPROVEMENT_ABS = 0.001
# The CPU clocks are used when (nearly) every sample has one.
MIN_CPU_MEASURED_SHARE = 0.95
CORES_TOLERANCE = 0.005
# A busy count whose share of a core the prefills' fit measures: at least this share of
# the prefills' time was spent at it.
MIN_COUNT_TIME_SHARE = 0.05
# The prefills' luck by their length: this many classes of about equal numbers of
# prefills, each of at least this many (`prefill_rates_by_length`).
PREFILL_LENGTH_CLASSES = 3
MIN_PREFILLS_PER_CLASS = 20


@dataclass(frozen=True, slots=True)
class HostShare:
    """What the window says about the shared host: the cores the agents got, how crowded
    the window was (mean busy agents while any computed), and every sample at its solo time."""

    cores: float
    mean_busy_agents: float
    prefill: tuple[PrefillSample, ...]
    decode: tuple[DecodeStepSample, ...]
    prefill_cores: float
    decode_cores: float
    # Each decode step's CPU time over its wall time, by how many agents computed during
    # it (empty when the agents did not measure CPU time): see `rates_by_busy`.
    decode_rates: dict[int, tuple[float, ...]] = field(default_factory=dict)
    # Each prefill's luck times its count's share, by busy count: see `prefill_rates_by_busy`.
    prefill_rates: dict[int, tuple[float, ...]] = field(default_factory=dict)
    # The CPU seconds of the prefill behind each of those rates (the same order at every
    # count): how much of the prefills' work ran at that luck (see `prefill_rates_by_busy`).
    prefill_rate_weights: tuple[float, ...] = ()
    # The same by the prefills' length, shortest first (`prefill_rates_by_length`).
    prefill_classes: tuple["PrefillClass", ...] = ()
    # How a decode step's share falls with its length; `decode_rates` are then each step's
    # share as at the reference length (see `decode_length_share`). None: as measured.
    decode_length: "DecodeLength | None" = None
    # The decode loops' pauses between two steps (seconds), by how many other agents
    # computed during each: see `pauses_by_busy`.
    decode_pauses: dict[int, tuple[float, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DecodeLength:
    """A decode step of `solo_s` CPU seconds gets (solo_s / reference_s) ** -exponent
    times the share a step of `reference_s` gets at the same busy count."""

    reference_s: float
    exponent: float

    def factor(self, solo_s: float) -> float:
        if not (solo_s > 0 and self.exponent):
            return 1.0
        return (solo_s / self.reference_s) ** -self.exponent


# The host's other CPU is measured over at least this span of serving (`host_other`).
MIN_OTHER_SPAN_S = 5.0
# Its background is measured over at least this long with no agent computing: a window
# with less (a busy one, as at speed 8, where nothing is idle) leaves it at 0.
MIN_IDLE_S = 5.0


@dataclass(frozen=True, slots=True)
class HostOther:
    """What the host spent beyond the agents' compute threads while they served (the
    Conductor, clients, the agents' other threads): `cores` on average over the window
    (on a host of `cpus`), of which `idle_cores` it spent whatever the load (its
    background, measured while no agent computed), and `per_prefill_s` of CPU per prefill
    served beyond that, so that a twin serving more prefills a second crowds its agents
    more (twin/host.py)."""

    cpus: int
    cores: float
    per_prefill_s: float
    idle_cores: float = 0.0


def host_other(
    host_cpu: Sequence[HostCpuSample],
    prefill: Sequence[PrefillSample],
    decode: Sequence[DecodeStepSample],
    *,
    min_prefill_points: int,
) -> HostOther | None:
    """The host's CPU beyond the agents' compute threads over the window's serving: its
    busy seconds between the first and the last counters read while prefills ran (the
    agents' heartbeats), less the CPU seconds the prefills and decode steps that ended in
    between measured. None with counters of more than one host (agents across hosts),
    a span under MIN_OTHER_SPAN_S, too few prefills in it, or computations without their
    CPU time.

    The background (`idle_cores`) is the rest's CPU over the spans between two counters in
    which no prefill or decode step computed, where they add up to MIN_IDLE_S; 0 otherwise.
    Without it a quiet window lends its background to the few prefills it served: on a
    2-CPU host at speed 1 the rest took 0.11-0.17 cores, 0.04-0.06 of them with nothing
    computing, and 40-61 ms of CPU per prefill counted whole against 23-32 ms at speed 8
    (no idle span there), so the twin crowded its agents at speed 1's bursts by far more
    than live's rest took in them.

    On a 2-CPU host at speed 7 this was 0.31-0.43 cores over the warm-up (20-30 ms of CPU
    per prefill), mostly the Conductor (about 0.19), the load generator (0.08) and the
    agents' threads beside their compute (0.1), and 0.05 cores more on average over the
    busier window after it, the share of a core the agents' prefills got falling with it.
    A twin crowding its agents by what its own load makes of it refused 1 % more requests
    than live over 28 kept runs (10 % fewer without); on a fresh set at speed 8, 13 % fewer
    at 2P:1D (26 % fewer without)."""
    if not host_cpu or not prefill or len({s.host_id for s in host_cpu}) != 1:
        return None
    first_start = min(s.time_s - max(s.seconds, 0.0) for s in prefill)
    last_end = max(s.time_s for s in prefill)
    read = sorted(
        (s for s in host_cpu if first_start <= s.time_s <= last_end), key=lambda s: s.time_s
    )
    if len(read) < 2 or read[-1].time_s - read[0].time_s < MIN_OTHER_SPAN_S:
        return None
    start, end = read[0], read[-1]
    inside = [s for s in (*prefill, *decode) if start.time_s < s.time_s <= end.time_s]
    num_prefills = sum(1 for s in inside if isinstance(s, PrefillSample))
    if num_prefills < min_prefill_points or any(s.cpu_s is None for s in inside):
        return None
    threads_s = sum(float(s.cpu_s or 0.0) for s in inside)
    other_s = max(0.0, (end.busy_s - start.busy_s) - threads_s)
    span_s = end.time_s - start.time_s
    idle_cores = _idle_cores(read, _intervals([*prefill, *decode]))
    return HostOther(
        cpus=end.cpus,
        cores=round(other_s / span_s, 4),
        per_prefill_s=round(max(0.0, other_s - idle_cores * span_s) / num_prefills, 6),
        idle_cores=round(idle_cores, 4),
    )


def _idle_cores(read: Sequence[HostCpuSample], computing: np.ndarray) -> float:
    """The host's busy cores over the spans between consecutive counters `read` (sorted)
    that no computing interval overlaps, where they add up to MIN_IDLE_S; else 0."""
    order = np.argsort(computing[:, 0])
    starts, ends = computing[order, 0], np.maximum.accumulate(computing[order, 1])
    idle_s = busy_s = 0.0
    for before, after in itertools.pairwise(read):
        # The last interval starting before `after` reaches furthest of those: free of
        # them all when it ends by `before`.
        k = int(np.searchsorted(starts, after.time_s, side="left"))
        if k and ends[k - 1] > before.time_s:
            continue
        idle_s += after.time_s - before.time_s
        busy_s += after.busy_s - before.busy_s
    return max(0.0, busy_s / idle_s) if idle_s >= MIN_IDLE_S else 0.0


def _intervals(samples: Sequence[PrefillSample | DecodeStepSample]) -> np.ndarray:
    ends = np.array([s.time_s for s in samples], dtype=float)
    seconds = np.maximum(np.array([s.seconds for s in samples], dtype=float), 0.0)
    return np.stack([ends - seconds, ends], axis=1)


class _BusyAgents:
    """n(t), the number of measured intervals covering t: piecewise constant between the
    sorted interval ends; `solo_s` integrates min(1, cores / n(t)) over each interval."""

    def __init__(self, intervals: np.ndarray) -> None:
        self.edges = np.unique(intervals.ravel())
        starts = np.searchsorted(self.edges, intervals[:, 0])
        ends = np.searchsorted(self.edges, intervals[:, 1])
        change = np.zeros(len(self.edges) + 1)
        np.add.at(change, starts, 1)
        np.add.at(change, ends, -1)
        self.count = np.cumsum(change)[:-1]  # on [edges[k], edges[k+1])
        self.widths = np.diff(self.edges)
        self._starts, self._ends = starts, ends

    def solo_s(self, cores: float) -> np.ndarray:
        counts = self.count[:-1]
        rate = np.where(counts > 0, np.minimum(1.0, cores / np.maximum(counts, 1)), 1.0)
        progress = np.concatenate([[0.0], np.cumsum(rate * self.widths)])
        return progress[self._ends] - progress[self._starts]

    def overfull_share(self, num_agents: int) -> float:
        """The share of busy time with more work at once than agents (clock jitter, or
        samples without their own end times)."""
        counts = self.count[:-1]
        busy = float(np.sum(self.widths[counts > 0]))
        return float(np.sum(self.widths[counts > num_agents])) / busy if busy > 0 else 0.0

    def mean_counts(self) -> np.ndarray:
        """Each interval's mean count over its length (itself included; 1 if empty)."""
        weighted = np.concatenate([[0.0], np.cumsum(self.count[:-1] * self.widths)])
        spans = np.concatenate([[0.0], np.cumsum(self.widths)])
        lengths = spans[self._ends] - spans[self._starts]
        summed = weighted[self._ends] - weighted[self._starts]
        return np.where(lengths > 0, summed / np.maximum(lengths, 1e-12), 1.0)

    def time_at_counts(self, num_agents: int) -> np.ndarray:
        """[interval, k]: the seconds each interval spent with k + 1 agents computing (k + 1
        up to `num_agents`; more, from clock jitter, counts as `num_agents`)."""
        counts = np.clip(self.count[:-1], 1, num_agents).astype(int)
        spent = np.zeros((len(self._starts), num_agents))
        for k in range(num_agents):
            at_k = np.concatenate([[0.0], np.cumsum(self.widths * (counts == k + 1))])
            spent[:, k] = at_k[self._ends] - at_k[self._starts]
        return spent

    def count_at(self, times_s: np.ndarray) -> np.ndarray:
        """n(t) at each of `times_s` (0 outside every interval)."""
        index = np.searchsorted(self.edges, times_s, side="right") - 1
        inside = (index >= 0) & (index < len(self.count))
        return np.where(inside, self.count[np.clip(index, 0, len(self.count) - 1)], 0)

    def mean_busy(self) -> float:
        counts = self.count[:-1]
        busy = counts > 0
        total = float(np.sum(self.widths[busy]))
        return float(np.sum(counts[busy] * self.widths[busy]) / total) if total > 0 else 0.0


def host_share(
    prefill: Sequence[PrefillSample],
    decode: Sequence[DecodeStepSample],
    *,
    num_agents: int,
    min_prefill_points: int,
) -> HostShare | None:
    """The window's measurements at their solo times (see the module docstring), or None
    when there are too few prefills to judge, fewer than two agents to crowd, or times that
    cannot be right (more work at once than agents: samples without their own end times)."""
    if num_agents < 2 or len(prefill) < min_prefill_points:
        return None
    samples = [*prefill, *decode]
    busy = _BusyAgents(_intervals(samples))
    if busy.overfull_share(num_agents) > MAX_OVERFULL_SHARE:
        return None
    cpu = [s.cpu_s for s in samples]
    if sum(c is not None for c in cpu) >= MIN_CPU_MEASURED_SHARE * len(samples):
        seconds = np.array([s.seconds for s in samples], dtype=float)
        solo = np.minimum(np.array([c if c is not None else np.nan for c in cpu]), seconds)
        solo = np.where(np.isnan(solo), seconds, solo)  # the few unmeasured: as measured
        everyone = np.ones(len(samples), dtype=bool)
        cores = _cores_of_work(busy, solo, everyone, num_agents)
        is_prefill = np.arange(len(samples)) < len(prefill)
        prefill_cores = _cores_of_work(busy, solo, is_prefill, num_agents)
        decode_cores = _cores_of_work(busy, solo, ~is_prefill, num_agents) if decode else cores
        is_decode = ~is_prefill
        counts = busy.mean_counts()
        decode_length = decode_length_share(
            counts[is_decode], seconds[is_decode], solo[is_decode], num_agents
        )
        rates = rates_by_busy(
            counts[is_decode], seconds[is_decode], solo[is_decode], num_agents, decode_length
        )
        prefill_time_at = busy.time_at_counts(num_agents)[is_prefill]
        prefill_rates, prefill_rate_weights = prefill_rates_by_busy(
            prefill_time_at, solo[is_prefill]
        )
        prefill_classes = prefill_rates_by_length(prefill_time_at, solo[is_prefill])
    else:
        cores = _cores_of_spread(prefill, busy, num_agents)
        prefill_cores = decode_cores = cores
        solo = busy.solo_s(cores)
        rates, prefill_rates, prefill_rate_weights, decode_length = {}, {}, (), None
        prefill_classes = ()
    return HostShare(
        prefill_cores=round(prefill_cores, 2),
        decode_cores=round(decode_cores, 2),
        cores=round(cores, 2),
        mean_busy_agents=busy.mean_busy(),
        prefill=tuple(
            replace(s, seconds=float(t)) for s, t in zip(prefill, solo[: len(prefill)], strict=True)
        ),
        decode=tuple(
            replace(s, seconds=float(t)) for s, t in zip(decode, solo[len(prefill) :], strict=True)
        ),
        decode_rates=rates,
        prefill_rates=prefill_rates,
        prefill_rate_weights=prefill_rate_weights,
        prefill_classes=prefill_classes,
        decode_length=decode_length,
        decode_pauses=pauses_by_busy(decode, busy, num_agents),
    )


def pauses_by_busy(
    decode: Sequence[DecodeStepSample], busy: "_BusyAgents", num_agents: int
) -> dict[int, tuple[float, ...]]:
    """Each measured pause of a decode loop between two steps (`DecodeStepSample.pause_s`),
    by how many other agents computed at its middle (the loop's own steps do not cover it).

    The loop hands out a step's tokens and takes in requests between two steps, on a core
    it shares, so its pause grows with the crowding: on a 2-CPU host at speed 9, 2P:1D, a
    median 0.02 ms at any count, but a mean 0.05-0.2 ms beside no busy agent and 0.6-1.0
    ms beside two (preempted now and then for milliseconds), 4-6 % of the loop's time
    there. The busy count leaves the loop out meanwhile, so the prefills beside it were
    measured with a core more at those moments; the twin's decode leaves the cores for a
    pause drawn from these (twin/decode.py), so that its prefills meet the same counts."""
    pauses = [
        (s.time_s - max(s.seconds, 0.0) - 0.5 * s.pause_s, s.pause_s)
        for s in decode
        if s.pause_s is not None and s.pause_s >= 0
    ]
    if not pauses:
        return {}
    middles = np.array([m for m, _ in pauses], dtype=float)
    counts = np.clip(busy.count_at(middles), 0, num_agents - 1).astype(int)
    by_count: dict[int, list[float]] = {}
    for count, (_, pause_s) in zip(counts, pauses, strict=True):
        by_count.setdefault(int(count), []).append(float(pause_s))
    return {count: tuple(values) for count, values in sorted(by_count.items())}


def rates_by_busy(
    busy_agents: np.ndarray,
    seconds: np.ndarray,
    cpu_s: np.ndarray,
    num_agents: int,
    length: DecodeLength | None = None,
) -> dict[int, tuple[float, ...]]:
    """Each computation's CPU time over its wall time (the share of a core it got), by the
    number of agents computing during it (its interval's mean count, rounded, itself
    included); given per computation: that mean count, its wall and its CPU seconds.

    Processor sharing describes neither role. Decode steps on a 2-CPU host with two prefill
    agents kept a median 93 %, 86 % and 80 % of their wall time on CPU at one, two and three
    busy agents (speed 1; 88, 85 and 86 % at speed 8), where an even share of the fitted
    decode cores gives 100, 87 and 58 %: the scheduler runs the waking decode loop ahead of
    the long prefills. Prefills at three busy agents took 1.2x to 4.3x their CPU time
    (p10-p90, speed 8) where the even share gives every one 2.1x: a short one is a few time
    slices the scheduler gives at once or late, and the Conductor's estimates (its pace, its
    queues), and so its admission, err with that scatter (prefills are filed by
    `prefill_rates_by_busy`, being long beside the count's changes). The twin draws from
    the quantiles at its own busy count (twin/spread.py): one place in the spread per
    decode step, one per prefill. With `length`, each step's share is
    given as at the reference length (its share over `length.factor` of its CPU seconds),
    and the twin scales it back by its own step's length."""
    rates: dict[int, list[float]] = {}
    for count, wall_s, cpu in zip(busy_agents, seconds, cpu_s, strict=True):
        if wall_s > 0:
            key = int(min(max(round(float(count)), 1), num_agents))
            rate = min(1.0, float(cpu) / float(wall_s))
            if length is not None:
                rate /= length.factor(float(cpu))
            rates.setdefault(key, []).append(rate)
    return {key: tuple(values) for key, values in sorted(rates.items())}


MIN_LENGTH_STEPS = 50
MIN_LENGTH_RATIO = 2.0  # the longest steps' CPU over the shortest's (p90 over p10)
MAX_LENGTH_EXPONENT = 1.0


def decode_length_share(
    busy_agents: np.ndarray, seconds: np.ndarray, cpu_s: np.ndarray, num_agents: int
) -> DecodeLength | None:
    """How a decode step's share of a core falls with its length: log(share) = c_n -
    exponent * log(CPU seconds), a least-squares fit through every step with an intercept
    of its own at each busy count n (its interval's mean count, rounded). None with too
    few steps or lengths too alike to tell; the exponent between 0 and MAX_LENGTH_EXPONENT.

    The scheduler runs a waking decode loop at once, so a short step often ends before it
    is preempted, while a long one shares the cores with the prefills beside it. On a 2-CPU
    host at three busy agents (speeds 8 and 10), steps of 3-5 ms of CPU got 0.80-0.85 of a
    core, 12-20 ms 0.61-0.67 and 20-30 ms 0.58-0.65; the window's long steps are the large
    batches a crowded decode builds, and a twin drawing every step's share from one spread,
    which the many short steps fill, ran them a third too fast: TBT p50 half of live's at
    speed 10. Reference: the steps' median CPU seconds."""
    valid = (seconds > 0) & (cpu_s > 0)
    if int(valid.sum()) < MIN_LENGTH_STEPS:
        return None
    cpu = cpu_s[valid]
    if np.quantile(cpu, 0.9) < MIN_LENGTH_RATIO * np.quantile(cpu, 0.1):
        return None
    counts = np.clip(np.round(busy_agents[valid]), 1, num_agents)
    x = np.log(cpu)
    y = np.log(np.minimum(1.0, cpu / seconds[valid]))
    for count in np.unique(counts):  # an intercept of each count's own
        at = counts == count
        x[at] -= x[at].mean()
        y[at] -= y[at].mean()
    spread = float(np.sum(x * x))
    if not spread > 0:
        return None
    exponent = float(np.clip(-np.sum(x * y) / spread, 0.0, MAX_LENGTH_EXPONENT))
    return DecodeLength(reference_s=float(np.median(cpu)), exponent=round(exponent, 4))


def prefill_rates_by_busy(
    time_at: np.ndarray, cpu_s: np.ndarray
) -> tuple[dict[int, tuple[float, ...]], tuple[float, ...]]:
    """A prefill's share of a core at each number of busy agents, and each prefill's luck:
    given per prefill the seconds it spent at each count (`time_at[i, n - 1]`) and its CPU
    seconds. Returns the rates by count and, in the same order, the CPU seconds of the
    prefill behind each rate (the weight its luck carries, below).

    A prefill is long beside the count's changes (a decode step every few milliseconds,
    other prefills starting and ending), so its CPU over its wall time mixes the shares of
    the counts it went through; filed under its mean count, as decode steps are
    (`rates_by_busy`), the rate at three busy agents holds prefills that spent a third of
    their time at two, and the twin, which applies the rate at each moment's count, gives
    a prefill at three busy agents more of a core than live's got (on a 2-CPU host at speed
    8, 2P:1D, the twin's prefills ran 7-15 % faster than live's in the same windows). Here
    each count's share is fitted through every prefill at once (least squares: CPU seconds
    = the sum over counts of seconds there times that count's share), over the counts that
    held at least MIN_COUNT_TIME_SHARE of the prefills' time; each prefill keeps its luck
    with the scheduler (its CPU over what the shares give it), and the rates at a count are
    that count's share times every prefill's luck (at most one core).

    Luck goes with length: a short prefill is a few time slices the scheduler often gives
    at once, a long one is preempted by every decode step beside it (on a 2-CPU host at
    three busy agents, prefills of 10-20 ms of CPU got a mean 0.62 of a core, those of
    80-160 ms 0.50). The twin draws a prefill's luck whatever its length, so drawn evenly
    over the prefills, the long ones that carry most of the work run at the short ones'
    luck: its prefill work went 8-13 % faster than live's in the same windows (2-CPU host,
    speeds 8 and 12), and its admission refused 19-32 % fewer requests. Weighted by each
    prefill's CPU seconds, the draw gives the work the luck the work had (`live_profile`
    takes weighted quantiles): within 4 % of live's, 5-11 % fewer refusals.

    Luck also goes with the count mixture: the fit is least squares through prefills of
    every length, so what it misses for a mixture (a long prefill at three busy agents for
    most of its time, two for the rest) lands in that prefill's luck, and the twin, drawing
    luck independently of the counts a prefill meets, loses the pairing: on a 2-CPU host at
    speed 9, 2P:1D, its prefills took 5-16 % more wall time per CPU second than live's in
    the same windows, its admission refused a fifth more. Every prefill's luck is scaled
    (`_luck_scale`) so that prefills drawing it independently over the window's own count
    mixtures take, in all, the wall time live's took."""
    fitted = _prefill_fit(time_at, cpu_s)
    if fitted is None:
        return {}, ()
    counts, shares, valid, luck = fitted
    luck = luck * _luck_scale(time_at[valid][:, counts], cpu_s[valid], shares, luck)
    return _rates(counts, shares, luck), tuple(float(c) for c in cpu_s[valid])


@dataclass(frozen=True, slots=True)
class PrefillClass:
    """The prefills of `from_s` CPU seconds or more (up to the next class's): their rates
    by busy count and the CPU seconds behind each rate, as `prefill_rates_by_busy` gives
    them for all prefills."""

    from_s: float
    rates: dict[int, tuple[float, ...]]
    weights: tuple[float, ...]


def prefill_rates_by_length(
    time_at: np.ndarray, cpu_s: np.ndarray, num_classes: int = PREFILL_LENGTH_CLASSES
) -> tuple[PrefillClass, ...]:
    """`prefill_rates_by_busy`'s rates, by the prefill's length: `num_classes` classes of
    CPU seconds holding about equal numbers of prefills (fewer where a class would hold
    fewer than MIN_PREFILLS_PER_CLASS), each count's share fitted through all prefills at
    once and each class's luck scaled to its own wall time; within a class each prefill
    weighs by its CPU seconds, as in `prefill_rates_by_busy`.

    Luck goes with length (a short prefill is a few time slices the scheduler often gives
    at once, a long one is preempted by every decode step beside it), and the CPU-weighted
    draw over all prefills gives every prefill the work's mean luck: the short ones too
    little of a core, and, the scale matching the total wall time, the long ones too much.
    On a 2-CPU host at speed 8, 2P:1D, the twin's prefills of 150 ms of CPU or more took
    1.67-1.69x their solo time where live's took 1.90-2.03x, those under 50 ms 1.92-2.03x
    against live's 1.72-1.83x; the long ones carry most of a queue's work, so the twin's
    queues drained faster than live's (TTFT p50 5-10 % low, a tenth to a third fewer
    refusals). Drawn by class, each length keeps the luck it had. Classes of equal
    numbers, not equal work: the shortest prefills are most of them, and their stalls (a
    thread preempted for 150 ms in a 15-ms prefill) are what lifts admission's pace, a
    ratio of measured to predicted seconds over the last few prefills; weighted by CPU in
    one class with the 50-ms ones, the twin drew such stretches too rarely."""
    fitted = _prefill_fit(time_at, cpu_s)
    if fitted is None:
        return ()
    counts, shares, valid, luck = fitted
    cpu = cpu_s[valid]
    spent = time_at[valid][:, counts]
    order = np.sort(cpu)
    bounds = [0.0]
    for part in range(1, num_classes):
        bound = float(order[len(order) * part // num_classes])
        below = int(np.sum(cpu < bound)) - int(np.sum(cpu < bounds[-1]))
        if below >= MIN_PREFILLS_PER_CLASS and np.sum(cpu >= bound) >= MIN_PREFILLS_PER_CLASS:
            bounds.append(bound)
    classes = []
    for low, high in zip(bounds, [*bounds[1:], math.inf], strict=True):
        inside = (cpu >= low) & (cpu < high)
        scaled = luck[inside] * _luck_scale(spent[inside], cpu[inside], shares, luck[inside])
        weights = tuple(float(c) for c in cpu[inside])
        classes.append(PrefillClass(low, _rates(counts, shares, scaled), weights))
    return tuple(classes)


def _prefill_fit(
    time_at: np.ndarray, cpu_s: np.ndarray
) -> tuple[list[int], np.ndarray, np.ndarray, np.ndarray] | None:
    """Each count's share fitted through all prefills (the counts kept, their shares), the
    prefills the shares give time to, and their luck (their CPU over what the shares give
    them); None when nothing can be fitted."""
    if len(cpu_s) == 0:
        return None
    total = time_at.sum(axis=0)
    counts = [k for k in range(time_at.shape[1]) if total[k] >= MIN_COUNT_TIME_SHARE * total.sum()]
    while counts:
        shares, *_ = np.linalg.lstsq(time_at[:, counts], cpu_s, rcond=None)
        if np.all(shares > 0):
            break
        counts.pop(int(np.argmin(shares)))  # too little to tell it from its neighbours
    if not counts:
        return None
    shares = np.minimum(shares, 1.0)
    given = time_at[:, counts] @ shares
    valid = given > 0
    return counts, shares, valid, cpu_s[valid] / given[valid]


def _rates(counts: list[int], shares: np.ndarray, luck: np.ndarray) -> dict[int, tuple[float, ...]]:
    return {
        k + 1: tuple(float(min(1.0, share * x)) for x in luck)
        for k, share in zip(counts, shares, strict=True)
    }


# The quantiles a profile gives a spread in (live_profile), and the draws between them the
# luck's scale averages over (the twin draws linearly between the quantiles).
NUM_QUANTILES = 41
LUCK_DRAWS = 401
MIN_LUCK_SCALE, MAX_LUCK_SCALE = 0.25, 4.0


def weighted_quantiles(values: np.ndarray, weights: np.ndarray, num: int) -> np.ndarray:
    """`num` evenly spaced quantiles of the distribution where each value counts by its
    weight (each at the middle of its weight's stretch of the cumulative sum, linear
    between)."""
    order = np.argsort(values)
    sorted_values, sorted_weights = values[order], weights[order]
    middles = (np.cumsum(sorted_weights) - 0.5 * sorted_weights) / np.sum(sorted_weights)
    return np.interp(np.linspace(0.0, 1.0, num), middles, sorted_values)


def _luck_scale(
    time_at: np.ndarray, cpu_s: np.ndarray, shares: np.ndarray, luck: np.ndarray
) -> float:
    """The factor on every prefill's luck under which prefills that draw their luck as the
    twin does (between the work-weighted quantiles a profile keeps, independently of the
    counts they meet) take in all the wall time live's took: each prefill i, at its own
    fractions of time at each count f_ik and its CPU seconds c_i, would take
    c_i / sum_k f_ik min(1, share_k x luck) for a drawn luck; summed over the prefills and
    averaged over the draws, that equals the prefills' measured wall time. 1 where it
    cannot be told."""
    wall = time_at.sum(axis=1)
    if len(luck) < 2 or not (np.all(wall > 0) and cpu_s.sum() > 0):
        return 1.0
    fractions = time_at / wall[:, None]
    quantiles = weighted_quantiles(luck, cpu_s, NUM_QUANTILES)
    drawn = np.interp(
        np.linspace(0.0, NUM_QUANTILES - 1, LUCK_DRAWS), np.arange(NUM_QUANTILES), quantiles
    )

    def wall_of(scale: float) -> float:
        rates = np.minimum(1.0, shares[None, :] * scale * drawn[:, None])  # [draw, count]
        mean_rate = fractions @ rates.T  # [prefill, draw]
        return float(np.mean(cpu_s[:, None] / np.maximum(mean_rate, 1e-9), axis=1).sum())

    measured = float(wall.sum())
    low, high = MIN_LUCK_SCALE, MAX_LUCK_SCALE
    if wall_of(high) > measured or wall_of(low) < measured:
        return 1.0  # beyond what a scale can reach (the caps): as fitted
    for _ in range(40):  # wall_of falls as the scale grows
        middle = math.sqrt(low * high)
        if wall_of(middle) > measured:
            low = middle
        else:
            high = middle
    return math.sqrt(low * high)


def _cores_of_work(
    busy: "_BusyAgents", cpu_s: np.ndarray, which: np.ndarray, num_agents: int
) -> float:
    """The cores under which processor sharing over the counted intervals does as much work
    in the `which` samples as their CPU clocks measured (the work grows with the cores)."""
    target = float(np.sum(cpu_s[which]))

    def work(cores: float) -> float:
        return float(np.sum(busy.solo_s(cores)[which]))

    low, high = MIN_CORES, float(num_agents)
    if work(high) <= target:
        return high  # no sign of crowding
    if work(low) >= target:
        return low
    while high - low > CORES_TOLERANCE:
        middle = (low + high) / 2
        if work(middle) < target:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def _cores_of_spread(
    prefill: Sequence[PrefillSample], busy: "_BusyAgents", num_agents: int
) -> float:
    """The cores under which the prefills at solo times scatter least around one fit."""
    inputs = np.array([s.input_tokens for s in prefill], dtype=float)
    cached = np.array([s.cached_tokens for s in prefill], dtype=float)
    # From as many cores as agents (no crowding) down: below one core per busy agent the
    # fits differ only in scale, so fewer cores must explain the spread better to be taken.
    best_cores = float(num_agents)
    best_spread = _log_residual_spread(inputs, cached, busy.solo_s(best_cores)[: len(prefill)])
    for cores in np.arange(num_agents - CORES_STEP, MIN_CORES - CORES_STEP / 2, -CORES_STEP):
        solo = busy.solo_s(float(cores))[: len(prefill)]
        spread = _log_residual_spread(inputs, cached, solo)
        if spread < best_spread - max(best_spread * MIN_IMPROVEMENT, MIN_IMPROVEMENT_ABS):
            best_cores, best_spread = float(cores), spread
    return best_cores


def _log_residual_spread(inputs: np.ndarray, cached: np.ndarray, seconds: np.ndarray) -> float:
    """Mean absolute deviation of log(measured / fitted) from its median, under a robust
    prefill fit (a median deviation would ignore a crowded minority of the samples)."""
    fit = fit_prefill(zip(inputs, cached, seconds, strict=True), robust=True)
    ones, new, pairs = prefill_columns(inputs, cached)
    central = fit.fixed_s * ones + fit.per_token_s * new + fit.per_token_pair_s * pairs
    valid = (central > 0) & (seconds > 0)
    if valid.sum() < 3:
        return np.inf
    logs = np.log(seconds[valid] / central[valid])
    return float(np.mean(np.abs(logs - np.median(logs))))
