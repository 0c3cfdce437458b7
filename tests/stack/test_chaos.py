"""`kvcentric chaos` on a short window: an agent and the Conductor SIGKILLed, a decode agent
killed, a data port flooded and an agent stopped while the shipped trace replays; the record
must show nothing lost. And the checks themselves, on records that did lose something."""

import json

import pytest
from typer.testing import CliRunner

from backend.bench.chaos import check_record, parse_schedule
from backend.cli import app

SCHEDULE = "3:kill:prefill-1,7:flood:prefill-0,11:kill:decode-0,14:kill:conductor,20:term:prefill-0"


def test_chaos_on_the_shipped_trace_loses_nothing(tmp_path) -> None:
    args = ["chaos", "--minutes", "0:0.4", "--schedule", SCHEDULE, "--settle-s", "8"]
    result = CliRunner().invoke(app, [*args, "--json", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert record["ok"] and record["num_accepted"] > 20, record
    assert (record["num_lost"], record["num_open"], record["num_expelled"]) == (0, 0, 0)
    assert [row["kind"] for row in record["faults"]] == ["kill", "flood", "kill", "kill", "term"]
    # Every killed or stopped child served again, the Conductor included.
    assert all(row["back_after_s"] for row in record["faults"] if row["kind"] != "flood"), record
    # What the Conductor's predecessor left open was ended when it came back.
    assert any(key.startswith("failed:conductor_restart") for key in record["outcomes"]) or (
        record["num_never_accepted"] > 0
    ), record
    assert (tmp_path / "record.json").is_file() and (tmp_path / "logs" / "conductor.log").is_file()


@pytest.mark.parametrize(
    ("schedule", "words"),
    [
        ("10:kill", "write SECONDS:KIND:TARGET"),
        ("x:kill:prefill-0", "'x' is not a number"),
        ("5:boom:prefill-0", "kind must be one of kill, term, flood"),
        ("5:flood:conductor", "only kill applies to the conductor"),
        ("", "the schedule holds no fault"),
    ],
)
def test_a_bad_schedule_is_one_clear_error(schedule: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_schedule(schedule)
    if schedule:
        result = CliRunner().invoke(app, ["chaos", "--schedule", schedule])
        assert result.exit_code == 2 and words in result.output


def test_an_unknown_target_is_named() -> None:
    result = CliRunner().invoke(app, ["chaos", "--schedule", "5:kill:decode-7"])
    assert result.exit_code == 2
    assert "5:kill:decode-7: no such target" in result.output


def test_the_check_finds_lost_open_duplicated_requests_and_expelled_agents() -> None:
    results = [
        {"id": "a", "status": "completed"},
        {"id": "b", "status": "failed"},
        {"id": "b", "status": "failed"},  # the same id twice
        {"id": "c", "status": "completed"},  # accepted, never recorded
        {"status": "failed", "message": "ConnectError"},  # refused while the Conductor was down
    ]
    rows = [
        {"id": "a", "state": "completed", "reason": None},
        {"id": "b", "state": None, "reason": None},  # open
    ]
    first, one = (
        frozenset({("prefill-0", ":1"), ("prefill-1", ":2")}),
        frozenset({("prefill-0", ":1")}),
    )
    again = frozenset({("prefill-0", ":1"), ("prefill-1", ":3")})  # its new life, a new port
    seen = [(1.0, first), (2.0, one), (3.0, again), (10.0, one)]
    faults = [{"time_s": 1.5, "replay_s": 1.5, "kind": "kill", "target": "prefill-1"}]
    events = [(2.5, "agent prefill-1 restarted (pid 7)")]
    record = check_record(results, rows, faults, seen, events, [])
    assert (record["lost"], record["open"], record["duplicates"]) == (["c"], ["b"], ["b"])
    assert record["num_never_accepted"] == 1
    # prefill-1's first departure is the kill's (noticed after 0.5 s, back after 1.5 s); its
    # second one, at 10 s with no fault, is an expulsion.
    assert record["faults"][0]["detected_after_s"] == pytest.approx(0.5)
    assert record["faults"][0]["back_after_s"] == pytest.approx(1.5)
    assert record["expelled"] == [{"time_s": 10.0, "instance_id": "prefill-1"}]
    assert not record["ok"]
