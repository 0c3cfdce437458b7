"""StopText: OpenAI's `stop` on whole texts and on streamed deltas split anywhere."""

import pytest

from backend.api.stops import StopText


@pytest.mark.parametrize(
    ("text", "stops", "expected", "stopped"),
    [
        ("hello world", ["wor"], "hello ", True),
        ("hello world", ["zzz"], "hello world", False),
        ("hello world", ["o w", "ll"], "he", True),  # the earliest match wins
        ("hello", [], "hello", False),
        ("hello", [""], "hello", False),  # an empty stop sequence stops nothing
        ("stop at once", ["stop"], "", True),
    ],
)
def test_a_whole_text_is_cut_at_the_first_stop(text, stops, expected, stopped) -> None:
    cutter = StopText(stops)
    assert cutter.cut(text) == expected
    assert cutter.stopped is stopped


@pytest.mark.parametrize("text", ["abcSTOPdef", "abcSTOdef", "STOP", "abcST", "aSTSTOPx"])
@pytest.mark.parametrize("split", [1, 2, 3])
def test_streamed_deltas_give_the_same_text_as_the_whole(text: str, split: int) -> None:
    cutter = StopText(["STOP"])
    deltas = [text[i : i + split] for i in range(0, len(text), split)]
    streamed = "".join(cutter.feed(delta) for delta in deltas) + cutter.flush()
    assert streamed == StopText(["STOP"]).cut(text)


def test_a_possible_stop_start_is_held_back_until_it_cannot_be_one() -> None:
    cutter = StopText(["STOP"])
    assert cutter.feed("abcST") == "abc"
    assert cutter.feed("x") == "STx"
    assert cutter.feed("ST") == ""
    assert cutter.feed("OP and more") == ""
    assert cutter.stopped and cutter.flush() == ""
