"""A request's TBT gaps are its decode agent's pace, not delivery's bunching."""

from backend.runtime.requests import RequestStream, Sampling


def _stream() -> RequestStream:
    return RequestStream("r1", (1, 2, 3), 8, Sampling(), arrival_s=0.0)


def test_gaps_are_read_from_when_the_agent_produced_each_token() -> None:
    stream = _stream()
    # Produced 10 ms apart, delivered in twos (two tokens read at once, then a wait).
    for index, arrived_s in enumerate((1.000, 1.000, 1.020, 1.020)):
        stream.push_token(index, arrived_s, produced_s=50.0 + 0.010 * index)
    assert [round(gap, 6) for gap in stream.tbt_gaps_s()] == [0.010, 0.010, 0.010]
    assert [round(value, 6) for value in stream.tbt_s()] == [0.010, 0.010, 0.010]  # mean, p99, max


def test_an_unstamped_token_falls_back_to_arrival_gaps() -> None:
    stream = _stream()
    stream.push_token(0, 1.000, produced_s=50.000)
    stream.push_token(1, 1.030, produced_s=0.0)  # an agent that does not stamp sends 0
    stream.push_token(2, 1.040, produced_s=50.020)
    assert [round(gap, 6) for gap in stream.tbt_gaps_s()] == [0.030, 0.010]
    assert _stream().tbt_gaps_s() == [] and _stream().tbt_s() is None
