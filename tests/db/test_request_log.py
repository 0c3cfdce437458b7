"""Requests, decisions and outcomes, on SQLite and PostgreSQL."""

import pytest
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from backend.db.errors import OutcomeAlreadyRecorded, RequestNotFound
from backend.db.records import RequestOutcome
from backend.db.request_log import (
    get_request,
    list_decisions,
    list_decisions_between,
    list_requests,
    record_arrival,
    record_decision,
    record_outcome,
)
from tests.db.helpers import BIG_KEY, BLOCK_SIZE, COMPLETED, arrival, dispatch


def test_an_arrival_round_trips_with_its_block_keys_and_slos(session: Session) -> None:
    keys = (BIG_KEY, 2**63, 7)
    stored = record_arrival(
        session=session,
        arrival=arrival("r1", 100.0, keys, ttft_slo_s=2.0),
        block_size=BLOCK_SIZE,
        api_key_id="k1",
        api_key_name="alice",
    )
    loaded = get_request(session=session, request_id="r1")
    assert loaded == stored
    assert loaded.block_keys == keys
    assert loaded.num_block_keys == 3
    assert (loaded.api_key_id, loaded.api_key_name) == ("k1", "alice")
    assert (loaded.ttft_slo_s, loaded.tbt_slo_s) == (2.0, None)
    assert loaded.outcome is None and not loaded.is_finished
    assert get_request(session=session, request_id="nope") is None


def test_a_request_id_is_recorded_once(session: Session) -> None:
    record_arrival(session=session, arrival=arrival("r1", 100.0), block_size=BLOCK_SIZE)
    with pytest.raises(IntegrityError):
        record_arrival(session=session, arrival=arrival("r1", 101.0), block_size=BLOCK_SIZE)
    session.rollback()


def test_decisions_keep_the_cache_plan_estimates_and_actual_ttft(session: Session) -> None:
    record_arrival(session=session, arrival=arrival("r1", 100.0), block_size=BLOCK_SIZE)
    first = record_decision(session=session, decision=dispatch("r1", "p2", None), now_s=100.1)
    second = record_decision(session=session, decision=dispatch("r1"), now_s=100.5)
    assert (first.num_local_blocks, first.fetch_source_instance_id, first.num_fetch_blocks) == (
        1,
        None,
        0,
    )
    assert (second.fetch_source_instance_id, second.num_fetch_blocks) == ("p1", 3)
    assert second.candidates == dispatch("r1").candidates
    record_outcome(session=session, request_id="r1", outcome=COMPLETED)

    decisions = list_decisions(session=session, request_id="r1")
    assert [d.prefill_instance_id for d in decisions] == ["p2", "p0"]
    # The measured TTFT belongs to the decision that served the request: the latest.
    assert [d.actual_ttft_s for d in decisions] == [None, 1.25]
    assert decisions[1].estimated_ttft_s == 1.7
    assert (decisions[1].num_reused_tokens, decisions[1].num_compute_tokens) == (2048, 100)


def test_a_decision_for_an_unknown_request_is_refused(session: Session) -> None:
    with pytest.raises(IntegrityError):
        record_decision(session=session, decision=dispatch("ghost"), now_s=1.0)
    session.rollback()


def test_a_request_ends_exactly_once(session: Session) -> None:
    record_arrival(session=session, arrival=arrival("r1", 100.0), block_size=BLOCK_SIZE)
    finished = record_outcome(session=session, request_id="r1", outcome=COMPLETED)
    assert finished.outcome == COMPLETED

    failed = RequestOutcome("failed", 106.0, reason="agent_dead", stage="decode")
    with pytest.raises(OutcomeAlreadyRecorded, match="already ended as 'completed'") as error:
        record_outcome(session=session, request_id="r1", outcome=failed)
    assert (error.value.recorded, error.value.attempted) == ("completed", "failed")
    with pytest.raises(OutcomeAlreadyRecorded):
        record_outcome(session=session, request_id="r1", outcome=COMPLETED)
    assert get_request(session=session, request_id="r1").outcome == COMPLETED

    with pytest.raises(RequestNotFound, match="no request 'ghost'"):
        record_outcome(session=session, request_id="ghost", outcome=COMPLETED)


@pytest.mark.parametrize(
    "outcome",
    [
        RequestOutcome(
            "rejected", 100.0, reason="ttft_slo", stage="admission", message="queue too long"
        ),
        RequestOutcome("rejected", 101.0, reason="tbt_slo", stage="decode", ttft_s=0.8),
        RequestOutcome("failed", 102.0, reason="agent_dead", stage="prefill"),
    ],
    ids=["early", "late", "failed"],
)
def test_every_terminal_state_round_trips(session: Session, outcome: RequestOutcome) -> None:
    record_arrival(session=session, arrival=arrival("r1", 99.0), block_size=BLOCK_SIZE)
    assert record_outcome(session=session, request_id="r1", outcome=outcome).outcome == outcome
    assert get_request(session=session, request_id="r1").outcome == outcome


def test_an_outcome_needs_a_known_state_and_a_reason_unless_completed() -> None:
    with pytest.raises(ValueError, match="unknown outcome state 'lost'"):
        RequestOutcome("lost", 1.0, reason="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="a rejected outcome needs a reason"):
        RequestOutcome("rejected", 1.0)


def test_list_requests_returns_a_half_open_window_in_arrival_order(session: Session) -> None:
    for request_id, now_s in [("c", 30.0), ("a", 10.0), ("b", 20.0), ("d", 40.0), ("z", 9.99)]:
        record_arrival(session=session, arrival=arrival(request_id, now_s), block_size=BLOCK_SIZE)
    window = list_requests(session=session, start_s=10.0, end_s=40.0)
    assert [r.request_id for r in window] == ["a", "b", "c"]
    assert [r.request_id for r in list_requests(session=session, start_s=0, end_s=99, limit=2)] == [
        "z",
        "a",
    ]


def test_decisions_between_is_a_half_open_window_in_time_order(session: Session) -> None:
    for request_id, at_s in (("a", 10.0), ("b", 20.0), ("c", 30.0)):
        record_arrival(session=session, arrival=arrival(request_id, at_s), block_size=BLOCK_SIZE)
        record_decision(session=session, decision=dispatch(request_id), now_s=at_s + 0.5)
    found = list_decisions_between(session=session, start_s=10.5, end_s=30.5)
    assert [(d.request_id, d.decided_time_s) for d in found] == [("a", 10.5), ("b", 20.5)]
