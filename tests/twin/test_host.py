"""SharedHost: instances crowding one host's cores by processor sharing."""

import pytest
import simpy

from backend.observe.host_share import DecodeLength, HostOther
from twin.decode import DecodeInstance, DecodeJob
from twin.host import OTHER_RATE_TAU_S, HostCores, SharedHost
from twin.timing import load_timing


def _finish_times(cores: float, jobs: list[tuple[float, float]]) -> list[float]:
    """When each (start_s, solo_s) job ends on a host of `cores`."""
    env = simpy.Environment()
    host = SharedHost(env, HostCores(cores, cores))
    ends = [0.0] * len(jobs)

    def job(index: int, start_s: float, solo_s: float):
        yield env.timeout(start_s)
        yield from host.run(solo_s)
        ends[index] = env.now

    for index, (start_s, solo_s) in enumerate(jobs):
        env.process(job(index, start_s, solo_s))
    env.run()
    return ends


def test_jobs_share_the_cores_and_speed_up_when_one_leaves() -> None:
    # One core: two 1 s jobs together end at 2 s; 1 s and 2 s: the short one at 2 s, then
    # the long one alone for its last second, at 3 s.
    assert _finish_times(1.0, [(0.0, 1.0), (0.0, 1.0)]) == pytest.approx([2.0, 2.0])
    assert _finish_times(1.0, [(0.0, 1.0), (0.0, 2.0)]) == pytest.approx([2.0, 3.0])
    # A job arriving half-way: both at half speed until the first ends (1.5 s), then the
    # second alone for its last half second.
    assert _finish_times(1.0, [(0.0, 1.0), (0.5, 1.0)]) == pytest.approx([1.5, 2.0])
    # As many cores as jobs: nobody waits.
    assert _finish_times(2.0, [(0.0, 1.0), (0.0, 1.0)]) == pytest.approx([1.0, 1.0])
    # 1.5 cores for three jobs: each at half speed.
    assert _finish_times(1.5, [(0.0, 1.0)] * 3) == pytest.approx([2.0] * 3)
    with pytest.raises(ValueError, match="prefill cores > 0"):
        HostCores(0.0, 1.0)


def test_a_decode_batch_steps_slower_while_a_prefill_computes_beside_it() -> None:
    env = simpy.Environment()
    host = SharedHost(env, HostCores(1.0, 1.0))
    timing = load_timing("paper")
    finished = {}
    decode = DecodeInstance(
        env, "d", timing, 10**9,
        on_start=lambda job, now_s: None,
        on_finish=lambda job, now_s, mean_s, max_s: finished.setdefault(job.request_id, now_s),
        host=host,
    )  # fmt: skip
    step_s = timing.decode_step_s(1, 1000)
    decode.admit(DecodeJob("a", 1000, 101))  # 100 steps
    assert host.num_busy == 1

    def prefill():  # computes for as long as 20 solo steps, from step 10 on
        yield env.timeout(10 * step_s)
        yield from host.run(20 * step_s)

    env.process(prefill())
    env.run()
    # Beside the prefill both ran at half speed: its 20 steps' worth of work took 40 steps'
    # time, holding 20 decode steps, so the last token comes 20 steps late (re-timed steps
    # see the context grown by then: a hair apart).
    assert finished["a"] == pytest.approx(120 * step_s, rel=1e-3)
    assert host.num_busy == 0


def test_each_role_is_slowed_by_the_cores_it_saw() -> None:
    # Measured live, the decode loop kept more of its CPU than the prefills beside it did.
    host = SharedHost(simpy.Environment(), HostCores(prefill=1.0, decode=1.5))
    assert host.rate("prefill") == host.rate("decode") == 1.0
    host.enter()
    host.enter()
    host.enter()
    assert host.rate("prefill") == pytest.approx(1 / 3)
    assert host.rate("decode") == pytest.approx(0.5)


def test_a_prefill_at_its_measured_share_keeps_its_place_as_the_count_changes() -> None:
    """A measured share replaces processor sharing: a 1 s prefill at half a core while two
    compute, alone at 0.9; the share is read again at every change of the count."""
    env = simpy.Environment()
    host = SharedHost(env, HostCores(1.0, 1.0))
    ends: dict[str, float] = {}
    shares = {1: 0.9, 2: 0.5}

    def job(name: str, start_s: float, solo_s: float, share):  # type: ignore[no-untyped-def]
        yield env.timeout(start_s)
        yield from host.run(solo_s, share)
        ends[name] = env.now

    env.process(job("measured", 0.0, 1.0, lambda n: shares[min(n, 2)]))
    env.process(job("other", 0.0, 0.25, None))  # processor sharing's 0.5 while two compute
    env.run()
    # Both at 0.5 until the other's 0.25 s of work ends at 0.5 s; then 0.75 s left at 0.9.
    assert ends["other"] == pytest.approx(0.5)
    assert ends["measured"] == pytest.approx(0.5 + 0.75 / 0.9)


def test_a_long_decode_step_gets_less_of_a_core_where_the_profile_measured_it() -> None:
    env = simpy.Environment()
    length = DecodeLength(reference_s=0.005, exponent=0.2)
    host = SharedHost(env, HostCores(1.5, 1.5, decode_length=length))
    host.enter()
    host.enter()
    measured = lambda num_busy: 0.8  # noqa: E731 (as at the reference length)
    assert host.rate("decode", measured, 0.005) == pytest.approx(0.8)
    assert host.rate("decode", measured, 0.040) == pytest.approx(0.8 * 8**-0.2)
    assert host.rate("decode", measured, 0.0001) == 1.0  # at most a whole core
    assert host.rate("prefill", measured, 0.040) == pytest.approx(0.8)  # decode steps only


def test_the_rest_of_the_host_takes_more_of_it_when_more_prefills_a_second_are_served() -> None:
    """Measured: the rest of a 2-CPU host took 0.4 cores while 20 prefills a second were
    served (20 ms of CPU each). At that load the measured shares stand; at twice the load
    the rest takes 0.8 cores and three busy agents share 1.2 instead of 1.6; idle, 2."""
    env = simpy.Environment()
    host = SharedHost(
        env, HostCores(1.0, 1.0, other=HostOther(cpus=2, cores=0.4, per_prefill_s=0.02))
    )
    host.num_busy = 3
    assert host.other_factor(3) == pytest.approx(1.0)
    assert host.rate("prefill", lambda n: 0.5) == pytest.approx(0.5)

    def serve(host: SharedHost, rate_per_s: float, seconds: float):  # type: ignore[no-untyped-def]
        for _ in range(round(rate_per_s * seconds)):
            yield env.timeout(1.0 / rate_per_s)
            host.note_prefill()

    env.process(serve(host, 40.0, 10 * OTHER_RATE_TAU_S))
    env.run()
    assert host.other_factor(3) == pytest.approx(1.2 / 1.6, rel=0.01)
    assert host.rate("prefill", lambda n: 0.5) == pytest.approx(0.5 * 1.2 / 1.6, rel=0.01)
    assert host.other_factor(1) == pytest.approx(1.0)  # one agent still has a core of its own
    env.run(until=env.now + 10 * OTHER_RATE_TAU_S)  # nothing served for a long while
    assert host.other_factor(3) == pytest.approx(2.0 / 1.6, rel=0.01)
    assert host.rate("prefill", lambda n: 0.9) == 1.0  # never more than a core
    # Of 0.4 cores, 0.1 spent whatever the load (its background): only the 0.3 above it
    # follows the prefills, so twice the load leaves three busy agents 1.3 cores, idle 1.9.
    calm = SharedHost(
        env,
        HostCores(
            1.0, 1.0, other=HostOther(cpus=2, cores=0.4, per_prefill_s=0.015, idle_cores=0.1)
        ),
    )
    calm.num_busy = 3
    assert calm.other_factor(3) == pytest.approx(1.0)
    env.process(serve(calm, 40.0, 10 * OTHER_RATE_TAU_S))
    env.run()
    assert calm.other_factor(3) == pytest.approx(1.3 / 1.6, rel=0.01)
    env.run(until=env.now + 10 * OTHER_RATE_TAU_S)
    assert calm.other_factor(3) == pytest.approx(1.9 / 1.6, rel=0.01)
    # Without the measurement, the shares stand whatever the load.
    plain = SharedHost(env, HostCores(1.0, 1.0))
    plain.note_prefill()
    assert plain.other_factor(3) == 1.0
