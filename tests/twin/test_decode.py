"""DecodeInstance: iteration-level batching by skipping ahead, exact token counts, KV room."""

import random

import simpy

from twin.decode import DecodeInstance, DecodeJob
from twin.timing import load_timing


def run_decode(jobs, *, start_s: float = 0.0, kv_capacity_tokens: int = 10**9):
    env = simpy.Environment(initial_time=start_s)
    started, finished = {}, {}
    decode = DecodeInstance(
        env,
        "d",
        load_timing("paper"),
        kv_capacity_tokens,
        on_start=lambda job, now_s: started.setdefault(job.request_id, now_s),
        on_finish=lambda job, now_s, mean_s, max_s: finished.setdefault(
            job.request_id, (now_s, mean_s, max_s)
        ),
    )

    def arrive():
        for at_s, job in jobs:
            yield env.timeout(max(0.0, start_s + at_s - env.now))
            decode.admit(job)

    env.process(arrive())
    env.run(until=start_s + 10_000)
    return decode, started, finished


def test_a_lone_request_takes_a_step_for_each_token_but_its_first() -> None:
    """Its first token comes from the prefill (a live decode agent emits it on joining and
    retires the request at its output length): 100 tokens are 99 steps."""
    decode, _, finished = run_decode([(0.0, DecodeJob("a", 1000, 100))])
    step_s = load_timing("paper").decode_step_s(1, 1000)
    end_s, mean_s, max_s = finished["a"]
    # The batch's context grows as tokens are generated, but the step is fixed per stretch.
    assert abs(end_s - 99 * step_s) < 1e-9
    assert abs(mean_s - step_s) < 1e-12 and max_s == step_s
    assert decode.batch_size == 0


def test_joining_requests_slow_the_batch_and_everyone_finishes() -> None:
    jobs = [(0.1 * n, DecodeJob(f"r{n}", 12_000, 50 + 10 * n)) for n in range(20)]
    decode, _, finished = run_decode(jobs)
    assert set(finished) == {f"r{n}" for n in range(20)}
    lone_step_s = load_timing("paper").decode_step_s(1, 12_000)
    assert max(mean for _, mean, _ in finished.values()) > lone_step_s
    assert abs(sum(decode.epoch_tokens) - sum(job.steps for _, job in jobs)) < 1e-6


def test_a_one_token_request_is_done_on_joining() -> None:
    decode, started, finished = run_decode([(0.5, DecodeJob("one", 100, 1))])
    assert started["one"] == 0.5 and finished["one"] == (0.5, 0.0, 0.0)
    assert decode.batch_size == 0 and sum(decode.epoch_tokens) == 0


def test_a_late_clock_still_finishes_exactly() -> None:
    # At t ~ 1e5..1e7 s a step is a tiny fraction of the clock; float error must not leave
    # the counter a hair short of a finish and spin on ever tinier timers (it once did).
    rng = random.Random(1)
    jobs = [
        (37.3 * n, DecodeJob(f"r{n}", rng.randint(500, 30_000), rng.randint(1, 800)))
        for n in range(40)
    ]
    for start_s in (2.8e5, 3.0e7):
        _, _, finished = run_decode(jobs, start_s=start_s)
        assert len(finished) == len(jobs)


def test_requests_wait_for_kv_room() -> None:
    jobs = [(0.0, DecodeJob("big", 900, 20)), (0.01, DecodeJob("next", 200, 5))]
    _, started, finished = run_decode(jobs, kv_capacity_tokens=1000)
    assert started["next"] >= finished["big"][0]
