"""Host sharing: the solo times beneath measurements of agents that crowded one host."""

import itertools
import json

import numpy as np
import pytest

from backend.observe.host_share import (
    DecodeLength,
    HostOther,
    decode_length_share,
    host_other,
    host_share,
    prefill_rates_by_busy,
    prefill_rates_by_length,
    rates_by_busy,
)
from backend.observe.live_profile import _quantiles, live_profile
from backend.policy.calibration import (
    Calibrator,
    DecodeStepSample,
    HostCpuSample,
    PrefillSample,
)
from backend.policy.cost_model import CostModel, DecodeFit, LinkModel, PrefillFit
from backend.rpc.reports import Join
from twin.host import HostCores
from twin.timing import load_timing

COST = CostModel(PrefillFit(0.01, 1e-4), DecodeFit(0.002, 0.001, 0.0), LinkModel(1e9), 2048)


def _solo_s(tokens: int) -> float:
    return COST.prefill_time_s(tokens, 0)


def _crowded_window() -> tuple[list[PrefillSample], list[DecodeStepSample]]:
    """Two prefill agents on a one-core host: each prefill alone for a while, then pairs
    of equal prefills computed together (each took twice its solo time), while a decode
    agent idles; then decode steps beside one prefill (each of them twice as slow)."""
    prefill, decode = [], []
    now_s = 0.0
    for n in range(10):  # alone
        tokens = 100 + 90 * n
        now_s += _solo_s(tokens)
        prefill.append(PrefillSample(now_s, tokens, 0, _solo_s(tokens)))
        now_s += 0.5
    for n in range(10):  # in pairs on one core: each progresses at 1/2
        tokens = 150 + 80 * n
        now_s += 2 * _solo_s(tokens)
        prefill += [PrefillSample(now_s, tokens, 0, 2 * _solo_s(tokens))] * 2
        now_s += 0.5
    start_s = now_s
    for _ in range(40):  # decode steps of 5 ms solo beside a prefill
        now_s += 0.010
        decode.append(DecodeStepSample(now_s, 3, 300, 0.010))
    prefill.append(PrefillSample(now_s, 1900, 0, now_s - start_s))  # 0.2 s solo, at 1/2
    return prefill, decode


def test_the_cores_and_solo_times_of_a_crowded_host_are_recovered() -> None:
    prefill, decode = _crowded_window()
    share = host_share(prefill, decode, num_agents=3, min_prefill_points=20)
    assert share is not None
    assert share.cores == pytest.approx(1.0, abs=0.051)
    for measured, solo in zip(prefill, share.prefill, strict=True):
        assert solo.seconds == pytest.approx(_solo_s(measured.input_tokens), rel=0.06)
    assert [step.seconds for step in share.decode] == pytest.approx([0.005] * 40, rel=0.06)
    assert 1.0 < share.mean_busy_agents < 2.0


def test_no_host_share_from_too_few_prefills_one_agent_or_impossible_times() -> None:
    prefill, decode = _crowded_window()
    assert host_share(prefill[:5], decode, num_agents=3, min_prefill_points=20) is None
    assert host_share(prefill, decode, num_agents=1, min_prefill_points=20) is None
    # Samples all stamped with one time (an agent that does not say when each ended):
    # more work at once than there are agents, so the times say nothing about crowding.
    stamped = [PrefillSample(9.0, p.input_tokens, 0, p.seconds) for p in prefill]
    assert host_share(stamped, decode, num_agents=3, min_prefill_points=20) is None


def _joins(host: str, other_host: str) -> list[Join]:
    return [
        Join(0, "p0", "prefill", f"{host}:1", "", "tcp", "tiny", 16, 10**6, 10**9, 0),
        Join(0, "p1", "prefill", f"{other_host}:2", "", "tcp", "tiny", 16, 10**6, 10**9, 0),
        Join(0, "d0", "decode", f"{host}:3", "", "tcp", "tiny", 16, 5 * 10**5, 10**9, 0),
    ]


def test_a_live_profile_of_one_host_holds_solo_times_and_its_cores() -> None:
    prefill, decode = _crowded_window()
    calibrator = Calibrator(COST)
    calibrator.add_prefill(prefill)
    calibrator.add_decode(decode)
    profile = live_profile(calibrator, _joins("127.0.0.1", "127.0.0.1"))
    assert profile["host"]["cores"] == pytest.approx(1.0, abs=0.051)
    point = next(p for p in profile["prefill_points"] if p["cached_tokens"] == 0)
    assert point["seconds"] == pytest.approx(_solo_s(point["input_tokens"]), rel=0.1)
    # Agents on two hosts do not crowd each other's cores: no host section, times as measured.
    assert "host" not in live_profile(calibrator, _joins("10.0.0.1", "10.0.0.2"))


def test_cpu_clocks_give_the_solo_times_and_each_roles_cores() -> None:
    """Two prefill agents and a decode agent on one host, measured with their CPU clocks:
    prefills computed in pairs at 0.4 of a core each, decode steps beside one prefill at 0.8.
    The solo times are the clocks; each role's cores make processor sharing do that work
    (prefill: 0.4 x 2 busy = 0.8 cores; decode: 0.8 x 2 busy = 1.6)."""
    prefill, decode = [], []
    now_s = 0.0
    for n in range(12):  # pairs of equal prefills
        solo_s = _solo_s(100 + 50 * n)
        now_s += solo_s / 0.4
        prefill += [PrefillSample(now_s, 100 + 50 * n, 0, solo_s / 0.4, cpu_s=solo_s)] * 2
        now_s += 0.5
    start_s = now_s
    for _ in range(40):  # 8 ms steps at 0.8 beside one prefill
        now_s += 0.010
        decode.append(DecodeStepSample(now_s, 3, 300, 0.010, cpu_s=0.008))
    prefill.append(PrefillSample(now_s, 2000, 0, now_s - start_s, cpu_s=0.4 * (now_s - start_s)))
    share = host_share(prefill, decode, num_agents=3, min_prefill_points=20)
    assert share is not None
    assert share.prefill_cores == pytest.approx(0.8, abs=0.011)
    assert share.decode_cores == pytest.approx(1.6, abs=0.011)
    assert 0.8 < share.cores < 1.6
    assert [s.seconds for s in share.prefill] == [s.cpu_s for s in prefill]
    assert [s.seconds for s in share.decode] == pytest.approx([0.008] * 40)


def test_the_twin_reads_each_roles_cores_from_a_live_profile(tmp_path) -> None:
    prefill, decode = _crowded_window()
    calibrator = Calibrator(COST)
    calibrator.add_prefill(prefill)
    calibrator.add_decode(decode)
    profile = live_profile(calibrator, _joins("127.0.0.1", "127.0.0.1"))
    profile["host"] |= {"prefill_cores": 0.75, "decode_cores": 1.5}
    path = tmp_path / "live.json"
    path.write_text(json.dumps(profile))
    assert load_timing(str(path)).host_cores == HostCores(prefill=0.75, decode=1.5)
    del profile["host"]["prefill_cores"], profile["host"]["decode_cores"]  # an older profile
    path.write_text(json.dumps(profile))
    cores = profile["host"]["cores"]
    assert load_timing(str(path)).host_cores == HostCores(prefill=cores, decode=cores)
    # How a decode step's share falls with its length, where the window measured it.
    profile["host"]["decode_length"] = {"reference_s": 0.005, "exponent": 0.15}
    path.write_text(json.dumps(profile))
    timing = load_timing(str(path))
    assert timing.host_cores.decode_length == DecodeLength(reference_s=0.005, exponent=0.15)
    profile["host"]["decode_length"]["reference_s"] = 0
    path.write_text(json.dumps(profile))
    with pytest.raises(ValueError, match=r"host\.decode_length\.reference_s"):
        load_timing(str(path))


def test_decode_steps_and_prefills_rates_are_kept_by_how_many_agents_computed() -> None:
    """Decode steps beside one prefill on one host (two busy): most got 0.9 of a core, one
    in five was preempted and got 0.3; processor sharing's even share of the fitted decode
    cores is their work's mean. Each step's rate is its CPU over its wall time, filed under
    two busy agents, and the live profile carries their quantiles for the twin to draw."""
    prefill, decode = [], []
    now_s = 0.0
    for n in range(12):  # pairs of equal prefills, as above
        solo_s = _solo_s(100 + 50 * n)
        now_s += solo_s / 0.4
        prefill += [PrefillSample(now_s, 100 + 50 * n, 0, solo_s / 0.4, cpu_s=solo_s)] * 2
        now_s += 0.5
    start_s = now_s
    for index in range(50):
        now_s += 0.010
        cpu_s = 0.003 if index % 5 == 4 else 0.009
        decode.append(DecodeStepSample(now_s, 3, 300, 0.010, cpu_s=cpu_s))
    prefill.append(PrefillSample(now_s, 2000, 0, now_s - start_s, cpu_s=0.4 * (now_s - start_s)))
    share = host_share(prefill, decode, num_agents=3, min_prefill_points=20)
    assert share is not None
    even = min(1.0, share.decode_cores / 2)  # two busy: this step and the long prefill
    assert even == pytest.approx((4 * 0.9 + 0.3) / 5, abs=0.01)  # the work's mean share
    assert set(share.decode_rates) == {2}
    rates = sorted(share.decode_rates[2])
    assert len(rates) == 50
    assert rates[0] == pytest.approx(0.3) and rates[-1] == pytest.approx(0.9)
    calibrator = Calibrator(COST)
    calibrator.add_prefill(prefill)
    calibrator.add_decode(decode)
    quantiles = live_profile(calibrator, _joins("127.0.0.1", "127.0.0.1"))["spread"]
    assert quantiles["decode_rate_2"][0] == pytest.approx(0.3)
    # The prefills (24 at 0.4 of a core while paired, the long one beside the steps) too.
    assert 24 <= sum(len(r) for r in share.prefill_rates.values()) <= 25
    assert all(r == pytest.approx(0.4) for r in share.prefill_rates[2])
    assert quantiles["prefill_rate_2"][0] == pytest.approx(0.4)


def test_each_busy_count_s_share_of_a_core_is_fitted_through_prefills_that_span_several() -> None:
    """Prefills spend parts of their time at two and at three busy agents, where a prefill
    gets 0.6 and 0.4 of a core; one in four was unlucky with the scheduler (half of that).
    Filed whole under its mean count, a prefill with a third of its time at two would say
    0.47 "at three"; fitted through all of them, each count gets its own share and every
    prefill its luck."""
    rng = np.random.default_rng(3)
    at_two = rng.uniform(0.0, 0.3, 40)
    at_three = rng.uniform(0.1, 0.6, 40)
    luck = np.where(np.arange(40) % 4 == 3, 0.5, 1.0)
    cpu_s = luck * (0.6 * at_two + 0.4 * at_three)
    time_at = np.stack([np.zeros(40), at_two, at_three], axis=1)  # nothing alone
    rates, weights = prefill_rates_by_busy(time_at, cpu_s)
    assert weights == pytest.approx(cpu_s)  # each rate's prefill, in order
    assert set(rates) == {2, 3}
    for count, share in ((2, 0.6), (3, 0.4)):
        assert len(rates[count]) == 40
        assert np.asarray(rates[count]) == pytest.approx(share * luck, rel=0.05)
    # Filed whole under their mean counts (decode steps' way), the same prefills read
    # the shares wrong by more than that.
    counts = (2 * at_two + 3 * at_three) / (at_two + at_three)
    filed = rates_by_busy(counts, at_two + at_three, cpu_s, 3)
    assert np.median(filed[3]) > 0.42


def test_prefill_rates_are_drawn_as_the_work_had_them_long_prefills_less_lucky() -> None:
    """Pairs of prefill agents on a one-core host, a decode agent idle: short prefills (20
    ms of CPU) got 0.9 of a core in their pair, long ones (200 ms) 0.4, ten short for every
    long. Drawn evenly over the prefills, the twin (which draws a prefill's luck whatever
    its length) would run the long ones, which carry most of the work, at mostly the short
    ones' luck; the live profile's quantiles weight each prefill by its CPU seconds, so the
    prefills' work runs at the share of a core it had live: 1 / E[1 / rate] over the
    drawn quantiles is the window's CPU over its wall time."""
    prefill: list[PrefillSample] = []
    now_s = 0.0
    for n in range(66):
        cpu_s, share = (0.2, 0.4) if n % 11 == 10 else (0.02, 0.9)
        now_s += cpu_s / share
        prefill += [PrefillSample(now_s, 100 + n, 0, cpu_s / share, cpu_s=cpu_s)] * 2
        now_s += 0.05
    share = host_share(prefill, [], num_agents=3, min_prefill_points=20)
    assert share is not None and set(share.prefill_rates) == {2}
    calibrator = Calibrator(COST)
    calibrator.add_prefill(prefill)
    quantiles = live_profile(calibrator, _joins("127.0.0.1", "127.0.0.1"))["spread"]
    draws = np.interp(
        np.linspace(0, 1, 100_001), np.linspace(0, 1, 41), quantiles["prefill_rate_2"]
    )
    cpu = sum(s.cpu_s or 0.0 for s in prefill)
    wall = sum(s.seconds for s in prefill)
    # The window's prefill work got 0.55 of a core (per eleven prefills, 0.2 s of CPU in
    # 0.22 s at 0.9 and 0.2 s in 0.5 s at 0.4); drawn evenly over the prefills, 0.81.
    assert cpu / wall == pytest.approx(0.554, abs=0.001)
    assert 1.0 / np.mean(1.0 / draws) == pytest.approx(cpu / wall, rel=0.03)
    evenly = np.asarray(share.prefill_rates[2])
    assert 1.0 / np.mean(1.0 / evenly) == pytest.approx(0.81, abs=0.02)


def test_a_decode_steps_share_falls_with_its_length_and_the_twin_scales_it_back() -> None:
    # At two and three busy agents, steps of 2-40 ms of CPU got 0.9 and 0.8 of a core at 5
    # ms, falling as the length to the power -0.2 (the scheduler runs a short one at once).
    rng = np.random.default_rng(1)
    cpu = np.exp(rng.uniform(np.log(0.002), np.log(0.04), 400))
    counts = np.where(np.arange(400) % 2, 2.0, 3.0)
    base = np.where(counts == 2, 0.9, 0.8)
    share = np.minimum(1.0, base * (cpu / 0.005) ** -0.2 * rng.uniform(0.95, 1.05, 400))
    length = decode_length_share(counts, cpu / share, cpu, num_agents=3)
    assert length is not None
    assert length.exponent == pytest.approx(0.2, abs=0.03)
    assert length.factor(length.reference_s) == 1.0
    # The rates are given as at the reference length: a long step's back to its own share.
    rates = rates_by_busy(counts, cpu / share, cpu, 3, length)
    longest = int(np.argmax(cpu[counts == 3]))
    scaled = rates[3][longest] * length.factor(float(cpu[counts == 3][longest]))
    assert scaled == pytest.approx(share[counts == 3][longest])
    # Lengths too alike to tell: no dependence fitted.
    alike = np.full(400, 0.005)
    assert decode_length_share(counts, alike / share, alike, num_agents=3) is None


def _twin_wall_s(rates: dict[int, tuple[float, ...]], weights, time_at, cpu_s) -> float:
    """The prefills' wall time in all if each drew its luck as the twin does (one place
    between the profile's work-weighted quantiles, the same at every count) independently
    of the counts it met, at its own fractions of time at each count."""
    draws = np.linspace(0.0, 1.0, 2001)
    by_count = np.zeros((len(draws), time_at.shape[1]))
    for count, values in rates.items():
        quantiles = _quantiles(list(values), list(weights))
        by_count[:, count - 1] = np.interp(draws, np.linspace(0, 1, len(quantiles)), quantiles)
    fractions = time_at / time_at.sum(axis=1, keepdims=True)
    return float(np.mean(cpu_s[:, None] / (fractions @ by_count.T), axis=1).sum())


def test_prefills_drawing_luck_as_the_twin_does_take_the_wall_time_live_took() -> None:
    """Each prefill got its own share of a core at two and three busy agents (0.9 and 0.45
    of a core times its luck with the scheduler, at most a core), the lucky ones short:
    the fit files what it misses in each prefill's luck, and a twin drawing that luck from
    the profile's quantiles, apart from the counts its prefill meets and capped at a core,
    would take 1.6 % more wall time than live's prefills did. Scaled, it takes live's."""
    rng = np.random.default_rng(2)
    num = 200
    at_two_share = rng.uniform(0, 0.6, num) ** 2
    luck = np.exp(rng.normal(0, 0.7, num))
    length = np.where(luck > 1, 0.02, 0.2) * rng.uniform(0.5, 1.5, num)
    at_two, at_three = at_two_share * length, (1 - at_two_share) * length
    cpu_s = np.minimum(1, 0.9 * luck) * at_two + np.minimum(1, 0.45 * luck) * at_three
    time_at = np.stack([np.zeros(num), at_two, at_three], axis=1)
    measured_wall_s = float(time_at.sum())
    rates, weights = prefill_rates_by_busy(time_at, cpu_s)
    assert _twin_wall_s(rates, weights, time_at, cpu_s) == pytest.approx(measured_wall_s, rel=0.005)
    with pytest.MonkeyPatch.context() as patch:  # the luck as fitted
        patch.setattr("backend.observe.host_share._luck_scale", lambda *args: 1.0)
        unscaled, _ = prefill_rates_by_busy(time_at, cpu_s)
    assert _twin_wall_s(unscaled, weights, time_at, cpu_s) > 1.01 * measured_wall_s


def test_decode_pauses_are_kept_by_how_many_other_agents_computed() -> None:
    """A decode loop's pause between two steps is filed under the count of the others at
    its middle: here 0.2 ms with no prefill computing, 1 ms beside one."""
    prefill = [PrefillSample(1.0 + 0.5 * n, 100, 0, 0.2, cpu_s=0.1) for n in range(30)]
    decode = []
    for n in range(30):  # a step of 5 ms every 50 ms, each after a pause
        start_s = 0.8 + 0.5 * n
        decode.append(DecodeStepSample(start_s + 0.005, 1, 100, 0.005, 0.005, 0.0002))
        start_s += 0.1  # in the middle of a prefill (which runs 0.3-0.5 s of each half second)
        decode.append(DecodeStepSample(start_s + 0.005, 1, 100, 0.005, 0.004, 0.001))
    decode.append(DecodeStepSample(20.0, 1, 100, 0.005, 0.005, None))  # after waiting for work
    share = host_share(prefill, decode, num_agents=3, min_prefill_points=20)
    assert share is not None
    assert share.decode_pauses == {0: (0.0002,) * 30, 1: (0.001,) * 30}
    calibrator = Calibrator(COST)
    calibrator.add_prefill(prefill)
    calibrator.add_decode(decode)
    spread = live_profile(calibrator, _joins("127.0.0.1", "127.0.0.1"))["spread"]
    assert spread["decode_pause_0"] == pytest.approx([0.0002] * 41)
    assert spread["decode_pause_1"] == pytest.approx([0.001] * 41)


def test_prefill_luck_is_kept_by_length_class_and_each_class_takes_its_wall_time() -> None:
    """Short prefills (10-30 ms of CPU) got 0.6 of a core at three busy agents, long ones
    (100-300 ms) 0.4, at 0.9 and 0.7 at two, luck apart. One draw for all would give a long
    prefill the work's mean luck; by class each length keeps its own, and prefills drawing
    as the twin does take each class's measured wall time."""
    rng = np.random.default_rng(5)
    num = 240
    long = np.arange(num) % 3 == 0
    cpu_s = np.where(long, rng.uniform(0.1, 0.3, num), rng.uniform(0.01, 0.03, num))
    at_two_share = rng.uniform(0.0, 0.4, num)
    share_two, share_three = np.where(long, 0.7, 0.9), np.where(long, 0.4, 0.6)
    luck = rng.uniform(0.9, 1.1, num)
    # CPU = wall x (the shares' mean over the time at each count) x luck.
    wall = cpu_s / (luck * (at_two_share * share_two + (1 - at_two_share) * share_three))
    time_at = np.stack([np.zeros(num), at_two_share * wall, (1 - at_two_share) * wall], axis=1)
    classes = prefill_rates_by_length(time_at, cpu_s)
    assert len(classes) >= 2 and classes[0].from_s == 0.0
    assert all(a.from_s < b.from_s for a, b in itertools.pairwise(classes))
    shortest, longest = classes[0], classes[-1]
    assert np.median(shortest.rates[3]) == pytest.approx(0.6, rel=0.1)
    assert np.median(longest.rates[3]) == pytest.approx(0.4, rel=0.1)
    bounds = [*(c.from_s for c in classes[1:]), np.inf]
    for prefill_class, high in zip(classes, bounds, strict=True):
        inside = (cpu_s >= prefill_class.from_s) & (cpu_s < high)
        assert prefill_class.weights == pytest.approx(cpu_s[inside])
        twin_s = _twin_wall_s(
            prefill_class.rates, prefill_class.weights, time_at[inside], cpu_s[inside]
        )
        assert twin_s == pytest.approx(float(time_at[inside].sum()), rel=0.01)
    # Too few prefills to split: one class, all of them.
    (only,) = prefill_rates_by_length(time_at[:30], cpu_s[:30])
    assert only.from_s == 0.0 and only.weights == pytest.approx(cpu_s[:30])


def _serving_with_counters(
    other_cores: float, *, host_ids: tuple[str, ...] = ("boot-1",)
) -> tuple[list[PrefillSample], list[DecodeStepSample], list[HostCpuSample]]:
    """Ten seconds of serving on a 2-CPU host: four 50-ms prefills a second at 0.04 CPU
    seconds each and ten decode steps of 0.02 CPU seconds, the rest of the host busy with
    `other_cores`; the agents' heartbeats read the counters twice a second, one host id
    after another, starting a second before the first prefill (starting up)."""
    prefill = [PrefillSample(1.0 + k * 0.25 + 0.05, 200, 0, 0.05, cpu_s=0.04) for k in range(40)]
    decode = [DecodeStepSample(1.0 + k * 0.1 + 0.02, 2, 400, 0.02, cpu_s=0.02) for k in range(100)]
    threads_per_s = 4 * 0.04 + 10 * 0.02
    counters = []
    busy_s = 100.0
    for k in range(23):
        time_s = k * 0.5
        # Starting up (before the first prefill): a whole core busy, which is left out.
        busy_s += 0.5 * (1.0 if time_s <= 1.0 else threads_per_s + other_cores)
        counters.append(
            HostCpuSample(time_s, host_ids[k % len(host_ids)], 2, busy_s, 2 * time_s + 500)
        )
    return prefill, decode, counters


def test_the_rest_of_the_hosts_cpu_is_its_busy_time_less_the_agents_compute_threads() -> None:
    prefill, decode, counters = _serving_with_counters(0.3)
    other = host_other(counters, prefill, decode, min_prefill_points=20)
    assert other is not None and other.cpus == 2
    assert other.cores == pytest.approx(0.3, abs=0.02)  # the start-up's core left out
    assert other.per_prefill_s == pytest.approx(0.3 / 4, rel=0.1)  # four prefills a second
    # Not to be told: two hosts' counters, too few prefills, a computation without its CPU
    # time, no counters at all.
    _, _, two_hosts = _serving_with_counters(0.3, host_ids=("boot-1", "boot-2"))
    assert host_other(two_hosts, prefill, decode, min_prefill_points=20) is None
    assert host_other(counters, prefill, decode, min_prefill_points=41) is None
    unmeasured = [*decode[:50], DecodeStepSample(decode[50].time_s, 2, 400, 0.02), *decode[51:]]
    assert host_other(counters, prefill, unmeasured, min_prefill_points=20) is None
    assert host_other([], prefill, decode, min_prefill_points=20) is None


def test_the_rest_of_the_hosts_background_is_measured_where_no_agent_computed() -> None:
    """A quiet window: one second of serving (four prefills, ten decode steps, the rest at
    0.05 + 0.075 per prefill a second), then a second of nothing but the rest's 0.05, ten
    times over. The 0.05 is the background, measured over the idle seconds; what the rest
    spends per prefill is what it spends beyond it, not the whole spread over the few
    prefills (which would be twice as much)."""
    prefill, decode, counters = [], [], []
    busy_s = 100.0
    for k in range(41):  # a counter every half second, 20 s
        time_s = k * 0.5
        # Serving in the half seconds ending at 0.5, 2.0, 2.5, 4.0, 4.5, ...; idle between.
        serving = int(time_s) % 2 == 0 and time_s > 0
        if serving:
            prefill += [
                PrefillSample(time_s - 0.5 + j * 0.25 + 0.05, 200, 0, 0.05, cpu_s=0.04)
                for j in range(2)
            ]
            decode += [
                DecodeStepSample(time_s - 0.5 + j * 0.1 + 0.02, 2, 400, 0.02, cpu_s=0.02)
                for j in range(5)
            ]
            busy_s += 0.5 * (4 * 0.04 + 10 * 0.02 + 0.05 + 4 * 0.075)
        elif k:
            busy_s += 0.5 * 0.05
        counters.append(HostCpuSample(time_s, "boot-1", 2, busy_s, 2 * time_s + 500))
    other = host_other(counters, prefill, decode, min_prefill_points=20)
    assert other is not None
    assert other.idle_cores == pytest.approx(0.05, abs=0.005)
    assert other.per_prefill_s == pytest.approx(0.075, rel=0.1)
    # A window with no idle span (as every busy one): no background, as before.
    prefill, decode, counters = _serving_with_counters(0.3)
    assert host_other(counters, prefill, decode, min_prefill_points=20).idle_cores == 0.0


def test_a_live_profile_says_what_the_rest_of_the_host_spent_and_the_twin_reads_it(
    tmp_path,
) -> None:
    prefill, decode = _crowded_window()
    calibrator = Calibrator(COST)
    calibrator.add_prefill(prefill)
    calibrator.add_decode(decode)
    assert "other" not in live_profile(calibrator, _joins("127.0.0.1", "127.0.0.1"))["host"]
    serving, steps, counters = _serving_with_counters(0.3)
    calibrator = Calibrator(COST)
    calibrator.add_prefill(serving)
    calibrator.add_decode(steps)
    calibrator.add_host_cpu(counters)
    restored = Calibrator(COST)
    restored.restore(json.loads(json.dumps(calibrator.to_state())))  # kept and restarted
    profile = live_profile(restored, _joins("127.0.0.1", "127.0.0.1"))
    other = profile["host"]["other"]
    assert other["cpus"] == 2 and other["cores"] == pytest.approx(0.3, abs=0.02)
    path = tmp_path / "live.json"
    path.write_text(json.dumps(profile))
    assert load_timing(str(path)).host_cores.other == HostOther(**other)
    profile["host"]["other"]["idle_cores"] = 0.05  # a quiet window's background
    path.write_text(json.dumps(profile))
    assert load_timing(str(path)).host_cores.other.idle_cores == 0.05
    profile["host"]["other"]["cpus"] = 1.5
    path.write_text(json.dumps(profile))
    with pytest.raises(ValueError, match=r"host\.other\.cpus"):
        load_timing(str(path))
