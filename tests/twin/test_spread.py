"""The measured spread of a live profile: quantile draws, the profile section, the twin run."""

import itertools
import json
import random

import pytest
import simpy

from backend.observe.live_profile import live_profile
from backend.policy.calibration import Calibrator, DecodeStepSample, PrefillSample, ServingSample
from backend.policy.cost_model import CostModel, DecodeFit, LinkModel, PrefillFit
from backend.rpc.reports import Join
from twin.decode import DecodeInstance, DecodeJob
from twin.host import HostCores, SharedHost
from twin.spread import MeasuredSpread, Quantiles, read_spread
from twin.timing import load_timing, policy_cost_model

COST = CostModel(PrefillFit(0.01, 1e-4), DecodeFit(0.005, 0.002, 0.0), LinkModel(1e9), 2048)


def test_quantile_draws_follow_the_measured_distribution() -> None:
    quantiles = Quantiles([0.0, 1.0, 2.0, 10.0])  # thirds: [0,1], [1,2], [2,10]
    rng = random.Random(1)
    draws = sorted(quantiles.draw(rng) for _ in range(30_000))
    assert draws[len(draws) // 3] == pytest.approx(1.0, abs=0.05)
    assert draws[2 * len(draws) // 3] == pytest.approx(2.0, abs=0.1)
    assert quantiles.at(0.5) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="non-decreasing"):
        Quantiles([2.0, 1.0])


def test_a_bad_spread_section_names_its_key() -> None:
    with pytest.raises(ValueError, match="unknown key"):
        read_spread({"spread": {"nope": [1, 2]}})
    with pytest.raises(ValueError, match=r"'spread\.dispatch_s'"):
        read_spread({"spread": {"dispatch_s": [3, 1]}})


def _calibrator() -> Calibrator:
    rng = random.Random(4)
    calibrator = Calibrator(COST)
    calibrator.add_prefill(
        PrefillSample(0.0, n, 0, COST.prefill_time_s(n, 0) * rng.uniform(0.5, 2.0))
        for n in (rng.randrange(20, 800) for _ in range(100))
    )
    calibrator.add_decode(
        DecodeStepSample(0.0, b, 100 * b, COST.decode_step_time_s(b, 0) * rng.uniform(0.8, 1.5))
        for b in (rng.randrange(1, 5) for _ in range(400))
    )
    calibrator.add_serving(
        ServingSample(0.0, rng.uniform(0.01, 0.05), rng.uniform(0.0, 0.2)) for _ in range(50)
    )
    return calibrator


def test_a_live_profile_runs_in_the_twin_with_its_spread(tmp_path) -> None:
    agents = [
        Join(0, "p0", "prefill", "", "", "tcp", "tiny", 16, 10**6, 10**9, 0),
        Join(0, "d0", "decode", "", "", "tcp", "tiny", 16, 5 * 10**5, 10**9, 0),
    ]
    profile = live_profile(_calibrator(), agents)
    assert set(profile["spread"]) == {
        "prefill_factor",
        "decode_factor",
        "dispatch_s",
        "first_token_s",
    }
    assert profile["instance"]["decode_kv_capacity_tokens"] == 5 * 10**5
    # Decode rows as measured: batch sizes 1 to 4, each about its median step.
    measured = {p["batch_size"] for p in profile["decode_points"] if p["batch_size"] <= 4}
    assert measured == {1, 2, 3, 4}
    path = tmp_path / "live.json"
    path.write_text(json.dumps(profile))
    timing = load_timing(str(path), seed=3)
    delays = [timing.first_token_delay_s() for _ in range(2000)]
    assert min(delays) >= 0.0 and max(delays) <= 0.2 and 0.08 < sum(delays) / 2000 < 0.12
    steps = {round(timing.decode_step_s(2, 200), 6) for _ in range(20)}
    assert len(steps) > 10  # each step drawn, not one constant
    # The policy's beliefs never carry the spread: stripped before the profiling sweep.
    assert policy_cost_model(timing) == policy_cost_model(load_timing(str(path), seed=9))
    assert timing.decode_share() is None  # agents on no shared host: processor sharing
    profile["spread"] |= {"decode_rate_1": [0.9, 1.0], "decode_rate_3": [0.6, 0.8]}
    path.write_text(json.dumps(profile))
    timing = load_timing(str(path), seed=3)
    # A decode batch's share: one place in the spread per stretch, read at each count.
    places = []
    for _ in range(100):
        share = timing.decode_share()
        assert share is not None
        place = (share(3) - 0.6) / 0.2
        assert 0.0 <= place <= 1.0
        assert share(1) == pytest.approx(0.9 + 0.1 * place) == share(2)  # nearest below: 1
        # Beyond the crowding measured: slowed by processor sharing (3 busy measured, 6 now).
        assert share(6) == pytest.approx(share(3) / 2)
        places.append(place)
    assert len({round(p, 6) for p in places}) > 50  # drawn for each stretch
    # A prefill's share: one place in the spread for its whole length, read at each count.
    assert timing.prefill_share() is None
    profile["spread"] |= {"prefill_rate_1": [0.8, 1.0], "prefill_rate_3": [0.2, 0.6]}
    path.write_text(json.dumps(profile))
    timing = load_timing(str(path), seed=3)
    for _ in range(50):
        share = timing.prefill_share()
        assert share is not None
        place = (share(3) - 0.2) / 0.4  # the same quantile at every count
        assert 0.0 <= place <= 1.0
        assert share(1) == pytest.approx(0.8 + 0.2 * place) == share(2)
        assert share(6) == pytest.approx(share(3) / 2)
    # By length class where the profile has them: a prefill of 60 ms alone draws from the
    # class from 50 ms, one of 10 ms from the shortest (the plain keys).
    profile["spread"] |= {
        "prefill_rate_1_from_50ms": [0.5, 0.5],
        "prefill_rate_3_from_50ms": [0.1, 0.1],
    }
    path.write_text(json.dumps(profile))
    timing = load_timing(str(path), seed=3)
    long_share, short_share = timing.prefill_share(0.06), timing.prefill_share(0.01)
    assert long_share is not None and short_share is not None
    assert (long_share(1), long_share(3)) == (0.5, 0.1)
    assert 0.8 <= short_share(1) <= 1.0 and 0.2 <= short_share(3) <= 0.6
    profile["spread"]["decode_rate_0"] = [0.5, 1.0]
    path.write_text(json.dumps(profile))
    with pytest.raises(ValueError, match="decode_rate_0"):
        load_timing(str(path))


def test_a_burst_reaches_its_prefill_instance_in_order(tmp_path) -> None:
    """The serving path to an agent is one path: each request draws its dispatch delay, but
    none overtakes one dispatched before it, so a burst arrives as a burst, in order (drawn
    independently, the delays would spread and reorder it and hide its queueing)."""
    from backend.traces.loader import TraceRow
    from twin.config import TwinConfig
    from twin.run import simulate

    agents = [
        Join(0, "p0", "prefill", "", "", "tcp", "tiny", 16, 10**6, 10**9, 0),
        Join(0, "d0", "decode", "", "", "tcp", "tiny", 16, 5 * 10**5, 10**9, 0),
    ]
    profile = live_profile(_calibrator(), agents)
    profile["spread"]["first_token_s"] = [0.0] * len(profile["spread"]["first_token_s"])
    path = tmp_path / "live.json"
    path.write_text(json.dumps(profile))
    rows = [TraceRow(0, 200 + 37 * i, 4, (), i + 1) for i in range(12)]  # all at once
    config = TwinConfig(num_prefill=1, num_decode=1, profile=str(path), rejection="none")
    report = simulate(config, rows)
    by_arrival = sorted(report["requests"], key=lambda r: int(r["id"][1:]))
    first_tokens = [r["arrival_s"] + r["ttft_s"] for r in by_arrival]
    assert first_tokens == sorted(first_tokens)  # one instance, in order: first come first


def test_a_decode_batch_keeps_its_draw_while_the_host_s_count_changes(tmp_path) -> None:
    """Live's decode steps are whole: a step that got a fifth of a core is not cut short
    because a prefill started beside it. A batch of one request runs 20 steps at a share of
    a core drawn from [0.2, 1.0] while another agent enters and leaves the host every
    millisecond: kept for the stretch, the steps take 1 / share on average, E[1/r] = ln 5 /
    0.8 = 2.01 times their solo time; re-drawn at every change of the count, as the twin
    did, they would take 1 / E[r] = 1.67 times."""
    profile = live_profile(_calibrator(), [])
    profile["spread"] = {"decode_rate_1": [0.2, 1.0], "decode_rate_2": [0.2, 1.0]}
    path = tmp_path / "live.json"
    path.write_text(json.dumps(profile))
    timing = load_timing(str(path), seed=5)
    env = simpy.Environment()
    host = SharedHost(env, HostCores(prefill=2.0, decode=2.0))
    tbt_means: list[float] = []
    decode = DecodeInstance(
        env, "d0", timing, 10**9, on_start=lambda job, now_s: None,
        on_finish=lambda job, now_s, tbt_mean_s, tbt_max_s: tbt_means.append(tbt_mean_s),
        host=host,
    )  # fmt: skip

    def flapping():  # another agent starting and ending work every millisecond
        while True:
            host.enter()
            yield env.timeout(0.001)
            host.leave()
            yield env.timeout(0.001)

    def requests():
        for index in range(300):
            decode.admit(DecodeJob(f"r{index}", 100, 20))
            while decode.batch_size:
                yield env.timeout(0.005)

    env.process(flapping())
    done = env.process(requests())
    env.run(until=done)
    solo_s = timing.decode_step_s(1, 100)
    assert sum(tbt_means) / len(tbt_means) / solo_s == pytest.approx(2.01, rel=0.1)


def test_each_decode_step_draws_its_own_share(tmp_path) -> None:
    """Live measures every step's share of a core: a batch's steps each have their own luck,
    so over many steps a request's gaps average 1 / share over the spread, E[1/r] = 2.01
    times the solo step for shares drawn from [0.2, 1.0], whatever the seed. One draw per
    stretch of constant batch gave a lone request one share for all its steps (1x to 5x),
    and where the batch changed by the clock (requests joining), weighted the steps by
    their share: the twin's small batches ran at 1 / E[r] of live's measured luck (its
    batch-1 steps took 1.19x their solo time where live's took 1.39x)."""
    profile = live_profile(_calibrator(), [])
    profile["spread"] = {"decode_rate_1": [0.2, 1.0]}
    path = tmp_path / "live.json"
    path.write_text(json.dumps(profile))
    ratios = []
    for seed in range(8):
        timing = load_timing(str(path), seed=seed)
        env = simpy.Environment()
        host = SharedHost(env, HostCores(prefill=2.0, decode=2.0))
        finished: list[float] = []
        decode = DecodeInstance(
            env, "d0", timing, 10**9, on_start=lambda job, now_s: None,
            on_finish=lambda job, now_s, tbt_mean_s, tbt_max_s, into=finished: into.append(
                tbt_mean_s
            ),
            host=host,
        )  # fmt: skip
        decode.admit(DecodeJob("r0", 100, 1000))
        env.run()
        solo_s = sum(timing.decode_step_s(1, 100 + k) for k in range(1000)) / 1000
        ratios.append(finished[0] / solo_s)
    assert ratios == pytest.approx([2.01] * 8, rel=0.06)


def test_the_decode_loop_pauses_between_steps_off_the_host_s_cores(tmp_path) -> None:
    """Where the profile measured the loop's pauses between steps (`decode_pause_N`, by
    other agents busy), the twin's decode leaves the host's cores for a drawn pause after
    each step: a prefill beside it meets one busy agent fewer meanwhile, the pause is part
    of the tokens' gaps, and the serving path's per-token cost is not added on top."""
    profile = live_profile(_calibrator(), [])
    profile["spread"] = {"decode_rate_1": [1.0, 1.0], "decode_pause_0": [0.004, 0.004]}
    profile["serving"]["per_token_s"] = 0.5  # would dwarf everything if still added
    path = tmp_path / "live.json"
    path.write_text(json.dumps(profile))
    timing = load_timing(str(path), seed=1)
    env = simpy.Environment()
    host = SharedHost(env, HostCores(prefill=2.0, decode=2.0))
    busy: list[tuple[float, int]] = []
    enter, leave = host.enter, host.leave
    host.enter = lambda owner=None: (enter(owner), busy.append((env.now, host.num_busy)))[0]  # type: ignore[method-assign]
    host.leave = lambda owner=None: (leave(owner), busy.append((env.now, host.num_busy)))[0]  # type: ignore[method-assign]
    finished: list[tuple[float, float]] = []
    decode = DecodeInstance(
        env, "d0", timing, 10**9, on_start=lambda job, now_s: None,
        on_finish=lambda job, now_s, tbt_mean_s, tbt_max_s: finished.append(
            (tbt_mean_s, tbt_max_s)
        ),
        host=host,
    )  # fmt: skip
    decode.admit(DecodeJob("r0", 100, 51))  # 50 steps (its first token is the prefill's)
    env.run()
    steps_s = [timing.decode_step_s(1, 100 + k) for k in range(50)]
    ((tbt_mean_s, tbt_max_s),) = finished
    # 50 steps at a full core, a 4 ms pause before each but the first
    assert tbt_mean_s == pytest.approx((sum(steps_s) + 49 * 0.004) / 50, rel=0.02)
    assert tbt_max_s < 0.5
    # off the cores during every pause, on them for every step: 50 entries, 49 leaves
    # between steps and the last leave when the batch emptied
    assert [n for _, n in busy].count(1) == 50 and [n for _, n in busy].count(0) == 50
    off_s = sum(b[0] - a[0] for a, b in itertools.pairwise(busy) if a[1] == 0)
    assert off_s == pytest.approx(49 * 0.004, rel=1e-6)


def test_without_measured_pauses_the_decode_stays_on_the_cores(tmp_path) -> None:
    profile = live_profile(_calibrator(), [])
    profile["spread"] = {"decode_rate_1": [1.0, 1.0]}
    path = tmp_path / "live.json"
    path.write_text(json.dumps(profile))
    timing = load_timing(str(path), seed=1)
    assert timing.decode_pause_s(0) is None
    assert not timing.measures_decode_pauses
    env = simpy.Environment()
    host = SharedHost(env, HostCores(prefill=2.0, decode=2.0))
    changes: list[int] = []
    enter, leave = host.enter, host.leave
    host.enter = lambda owner=None: (enter(owner), changes.append(host.num_busy))[0]  # type: ignore[method-assign]
    host.leave = lambda owner=None: (leave(owner), changes.append(host.num_busy))[0]  # type: ignore[method-assign]
    decode = DecodeInstance(
        env, "d0", timing, 10**9, on_start=lambda job, now_s: None,
        on_finish=lambda job, now_s, tbt_mean_s, tbt_max_s: None, host=host,
    )  # fmt: skip
    decode.admit(DecodeJob("r0", 100, 50))
    env.run()
    assert changes == [1, 0]


def test_asking_whether_pauses_were_measured_draws_nothing() -> None:
    """A decode instance asks this when it is built: the answer must leave the twin's
    random stream where it was, so the draws do not depend on how many instances exist."""
    spreads = read_spread({"spread": {"decode_pause_0": [0.001, 0.002, 0.004, 0.008]}})
    asked = MeasuredSpread(load_timing("tiny-cpu"), spreads, seed=3)
    untouched = MeasuredSpread(load_timing("tiny-cpu"), spreads, seed=3)
    assert asked.measures_decode_pauses
    assert [asked.decode_pause_s(0) for _ in range(5)] == [
        untouched.decode_pause_s(0) for _ in range(5)
    ]


def test_a_pause_is_drawn_at_the_nearest_count_measured_and_lengthened_beyond() -> None:
    pauses = {"decode_pause_0": [0.001, 0.001], "decode_pause_2": [0.003, 0.003]}
    spreads = read_spread({"spread": pauses})
    timing = MeasuredSpread(load_timing("tiny-cpu"), spreads, seed=0)
    assert timing.measures_decode_pauses  # asked without drawing a pause
    assert timing.decode_pause_s(0) == pytest.approx(0.001)
    assert timing.decode_pause_s(1) == pytest.approx(0.001)  # at most the count
    assert timing.decode_pause_s(2) == pytest.approx(0.003)
    assert timing.decode_pause_s(3) == pytest.approx(0.0045)  # processor sharing beyond
    between = MeasuredSpread(
        load_timing("tiny-cpu"),
        read_spread({"spread": {"decode_pause_1": [0.002, 0.002], "decode_pause_3": [0.004] * 2}}),
        seed=0,
    )
    assert between.decode_pause_s(2) == pytest.approx(0.002)  # measured beyond: not scaled
    with pytest.raises(ValueError, match="decode_pause_x"):
        read_spread({"spread": {"decode_pause_x": [0.1, 0.2]}})


def test_the_answer_s_way_back_comes_after_the_prefill_and_moves_the_line(tmp_path) -> None:
    """A prefill agent's answer reaches the Conductor a measured while after the prefill
    (`spread.answer_s`): the request's first token waits for it, and the core sees the
    prefill end, and the next one in the instance's line start, when it arrives, as the live
    runtime's line (backend/policy/lines.py) has them; the instance itself takes the next
    one up after the line's measured hand-over (`spread.handover_s`), which the first,
    finding the worker free, does not wait."""
    from backend.traces.arrivals import arrivals_from_rows
    from backend.traces.loader import TraceRow
    from twin.cluster import TwinCluster
    from twin.config import TwinConfig
    from twin.run import believed_cost_model

    agents = [
        Join(0, "p0", "prefill", "", "", "tcp", "tiny", 16, 10**6, 10**9, 0),
        Join(0, "d0", "decode", "", "", "tcp", "tiny", 16, 5 * 10**5, 10**9, 0),
    ]
    calibrator = _calibrator()
    calibrator.add_serving(ServingSample(0.0, 0.01, 0.0, answer_s=0.2) for _ in range(50))
    calibrator.add_prefill(PrefillSample(0.0, 300, 0, 0.03, handover_s=0.05) for _ in range(50))
    profile = live_profile(calibrator, agents)
    spread = profile["spread"]
    assert spread["answer_s"] == [0.2] * len(spread["answer_s"])
    assert spread["handover_s"] == [0.05] * len(spread["handover_s"])
    # Constant draws, so the times below are exact.
    for key in ("prefill_factor", "decode_factor"):
        spread[key] = [1.0] * len(spread[key])
    spread["dispatch_s"] = [0.01] * len(spread["dispatch_s"])
    spread["first_token_s"] = [0.0] * len(spread["first_token_s"])
    path = tmp_path / "live.json"
    path.write_text(json.dumps(profile))
    config = TwinConfig(num_prefill=1, num_decode=1, profile=str(path), rejection="none")
    timing = load_timing(str(path), seed=1)
    cluster = TwinCluster(
        config,
        timing,
        believed_cost_model(str(path), config.block_size),
        dram_blocks=1000,
        ssd_blocks=0,
        decode_kv_capacity_tokens=10**6,
    )
    seen = []
    handle = cluster.core.handle

    def spy(event):
        seen.append(event)
        return handle(event)

    cluster.core.handle = spy  # type: ignore[method-assign]
    rows = [TraceRow(0, 300, 4, (), 1), TraceRow(0, 300, 4, (), 2)]  # both at once
    cluster.run(arrivals_from_rows(rows, block_size=config.block_size, speed=1.0))
    fed = [(type(e).__name__, getattr(e, "request_id", None), e.now_s, e) for e in seen]
    started = {rid: t for name, rid, t, _ in fed if name == "PrefillStarted"}
    finished = {rid: (t, e) for name, rid, t, e in fed if name == "PrefillFinished"}
    first, second = sorted(started, key=started.get)
    # The first starts as it is dispatched to the empty line, before it reaches the agent.
    assert started[first] == 0.0
    prefill_s = finished[first][1].took_s  # the seconds the instance worked on it
    assert prefill_s == pytest.approx(timing.prefill_s(300, 0))
    # Its end reaches the core 0.2 s after the prefill, and the second starts with it.
    assert finished[first][0] == pytest.approx(0.01 + prefill_s + 0.2)
    assert started[second] == finished[first][0]
    # The instance took the second up after the hand-over, and worked on it as long.
    assert finished[second][0] == pytest.approx(0.01 + 2 * prefill_s + 0.05 + 0.2)
    assert finished[second][1].took_s == pytest.approx(prefill_s)
    ttfts = {r.id: r.ttft_s for r in cluster.recorder.records.values()}
    assert ttfts[first] == pytest.approx(0.01 + prefill_s + 0.2, abs=1e-3)  # + the KV's way
