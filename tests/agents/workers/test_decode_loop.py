"""The decode loop with a busy batch: calls from other threads (the load a heartbeat reports,
a cancel, a new request) get in between two steps, never starved by the stepping thread."""

import threading
import time

from agents.node.decode_loop import DecodeLoop
from agents.workers import DecodeOutcome, DecodeWorker, PrefillWorker
from tests.agents.model.helpers import BLOCK_SIZE, prompt
from tests.agents.workers.test_decode import make_request

LONG = 100_000  # output tokens: decoding all through the test


def test_calls_from_other_threads_get_in_between_steps_of_a_busy_batch(tiny_model) -> None:
    prefill = PrefillWorker(tiny_model, BLOCK_SIZE)
    loop = DecodeLoop(DecodeWorker(tiny_model))
    try:
        streams = [
            loop.submit(make_request(prefill, f"busy-{i}", prompt(100 + i, 40), LONG))
            for i in range(4)
        ]
        while loop.load()[0] != 4:
            time.sleep(0.01)
        waits: list[float] = []

        def caller() -> None:
            for _ in range(40):
                started_s = time.perf_counter()
                loop.load()
                loop.take_steps()
                waits.append(time.perf_counter() - started_s)

        callers = [threading.Thread(target=caller) for _ in range(2)]
        for thread in callers:
            thread.start()
        for thread in callers:
            thread.join(60)
        # A step of the tiny model takes milliseconds: a call waits for one step at most.
        assert max(waits) < 0.5, f"waited up to {max(waits):.2f} s"

        started_s = time.perf_counter()
        assert loop.cancel("busy-0", "client_disconnected")
        assert time.perf_counter() - started_s < 0.5
        items = [streams[0].get(timeout=5)]
        while not isinstance(items[-1], DecodeOutcome):
            items.append(streams[0].get(timeout=5))
        assert items[-1].status == "cancelled"
    finally:
        for request_id in ("busy-1", "busy-2", "busy-3"):
            loop.cancel(request_id, "test over")
        loop.stop()


def test_each_step_carries_the_loop_s_pause_before_it(tiny_model) -> None:
    """A step after the previous one carries the pause between them (the loop handing
    out tokens and letting callers in); the first step after waiting for work carries
    none, since waiting is no pause."""
    prefill = PrefillWorker(tiny_model, BLOCK_SIZE)
    loop = DecodeLoop(DecodeWorker(tiny_model))
    try:
        stream = loop.submit(make_request(prefill, "short", prompt(7, 40), 12))
        while not isinstance(stream.get(timeout=10), DecodeOutcome):
            pass
        steps = loop.take_steps()
        assert len(steps) >= 11
        assert steps[0].pause_s is None
        pauses = [s.pause_s for s in steps[1:]]
        assert all(p is not None and 0.0 <= p < 0.5 for p in pauses), pauses
        ends = [s.time_s for s in steps]
        for before, after, step in zip(ends, ends[1:], steps[1:], strict=False):
            # the wall clock between two steps' ends holds the pause and the step
            assert after - before >= step.seconds + step.pause_s - 0.002
    finally:
        loop.stop()
