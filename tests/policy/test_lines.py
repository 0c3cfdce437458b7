"""The prefill lines as the Conductor sees them (shared by the live runtime and the twin)."""

from backend.policy.lines import PrefillLines


def test_a_request_starts_when_dispatched_to_an_empty_line() -> None:
    lines = PrefillLines()
    assert lines.join("p0", "a") is True
    assert lines.join("p0", "b") is False  # behind a
    assert lines.join("p1", "c") is True  # another instance's line


def test_the_next_starts_when_the_head_s_answer_comes_back() -> None:
    lines = PrefillLines()
    for request_id in "abc":
        lines.join("p0", request_id)
    assert lines.leave("p0", "a", lambda _: True) == "b"
    assert lines.leave("p0", "c", lambda _: True) is None  # not first: nothing starts
    assert lines.leave("p0", "b", lambda _: True) is None  # the line is empty now
    assert lines.join("p0", "d") is True


def test_requests_no_longer_waiting_leave_the_line_on_the_way() -> None:
    lines = PrefillLines()
    for request_id in "abcd":
        lines.join("p0", request_id)
    gone = {"b", "c"}  # ended or moved to another instance meanwhile
    assert lines.leave("p0", "a", lambda r: r not in gone) == "d"
    assert lines.leave("p0", "d", lambda _: True) is None
    assert lines.join("p0", "e") is True


def test_a_request_not_in_the_line_and_a_forgotten_instance_change_nothing() -> None:
    lines = PrefillLines()
    lines.join("p0", "a")
    assert lines.leave("p0", "x", lambda _: True) is None
    assert lines.leave("p9", "a", lambda _: True) is None
    lines.forget("p0")
    assert lines.join("p0", "b") is True
