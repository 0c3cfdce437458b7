"""The agent's prefill worker goes to the waiting prefills in the Conductor's line order."""

import threading
import time

from agents.node.line import PrefillLine


def _wait_until(predicate) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 5.0
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def _run_all(line: PrefillLine, positions: list[int]) -> list[int]:
    """Hold the worker, let prefills with `positions` queue one after another in that
    order, release it: the order (by arrival number) in which they ran."""
    ran: list[int] = []
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with line.turn():
            holding.set()
            release.wait(5)

    def prefill(number: int, position: int) -> None:
        with line.turn(position):
            ran.append(number)

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait(5)
    threads = []
    for number, position in enumerate(positions):
        thread = threading.Thread(target=prefill, args=(number, position))
        thread.start()
        threads.append(thread)
        _wait_until(lambda n=number: line.num_waiting == n + 1)
    release.set()
    for thread in [holder, *threads]:
        thread.join(5)
    return ran


def test_waiting_prefills_run_in_line_order_whatever_order_they_came() -> None:
    # Calls racing on the server's threads reach the worker out of order: 3 before 1 and 2.
    positions = [3, 1, 4, 2, 5]
    ran = _run_all(PrefillLine(), positions)
    assert [positions[number] for number in ran] == [1, 2, 3, 4, 5]


def test_without_positions_first_come_first_served() -> None:
    line = PrefillLine()
    assert _run_all(line, [0] * 6) == list(range(6))
    with line.turn():  # free again
        pass


def test_the_worker_passes_straight_to_the_next_and_measures_the_hand_over() -> None:
    """A prefill that finds the worker free measures no hand-over; one that waited measures
    from the one ahead letting go to it holding the worker."""
    line = PrefillLine()
    turns = []
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with line.turn() as turn:
            turns.append(("first", turn))
            holding.set()
            release.wait(5)

    def wait_then_run() -> None:
        with line.turn() as turn:
            turns.append(("second", turn))

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait(5)
    waiter = threading.Thread(target=wait_then_run)
    waiter.start()
    _wait_until(lambda: line.num_waiting == 1)
    release.set()
    for thread in (holder, waiter):
        thread.join(5)
    (first_name, first), (second_name, second) = turns
    assert (first_name, second_name) == ("first", "second")
    assert first.handover_s is None
    assert second.handover_s is not None and 0.0 <= second.handover_s < 1.0
    with line.turn() as turn:  # free again, nobody waiting
        assert turn.handover_s is None
