"""The Audit page against the real backend: every entry of GET /v1/audit with who, when, what
(old -> new) and the prediction it came with."""

import httpx

from console import format as fmt
from console.history import prediction_caption
from tests.console.conftest import ADMIN_TOKEN
from tests.console.pages import errors, metrics, open_page


def _change(backend, config: dict, prediction: dict | None) -> None:
    response = httpx.put(
        f"{backend.url}/v1/config",
        json={"config": config, "prediction": prediction},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    assert response.status_code == 200, response.text


def test_each_entry_says_who_when_what_and_the_prediction(app, backend):
    old = backend.get("/v1/config")["config"]["decode_time_s"]
    _change(backend, {"decode_time_s": 12.5}, {"goodput_rps": 1.25, "note": "by hand"})
    _change(backend, {"decode_time_s": old}, None)
    open_page(app, "audit")
    entries = backend.get("/v1/audit", limit=100)
    # A static table (its cells wrap: nothing cut off), rows labelled by time.
    rows = app.table[0].value.reset_index().to_dict("records")
    assert len(rows) == len(entries) and metrics(app)["Entries shown"] == str(len(entries))
    for row, entry in zip(rows, entries, strict=True):
        assert row["time"] == fmt.clock(entry["time_s"])
        assert (row["who"], row["action"]) == (entry["actor"], entry["action"])
    newest, changed = rows[0], rows[1]
    assert newest["what"] == f"decode_time_s: 12.5 -> {fmt.number(old)}"
    assert newest["prediction"] == ""
    assert changed["who"] == "admin" and changed["action"] == "config.update"
    assert changed["what"] == f"decode_time_s: {fmt.number(old)} -> 12.5"
    assert changed["prediction"] == "goodput_rps=1.25, note=by hand"
    assert rows[-1]["action"] == "config.initial" and rows[-1]["what"].startswith("initial: ")
    # Each prediction in full, under its own expander.
    assert any(expander.label.endswith("config.update by admin") for expander in app.expander)
    assert not errors(app)


def test_without_a_key_the_page_says_what_to_do(app, monkeypatch):
    monkeypatch.delenv("KVC_CONSOLE_API_KEY")
    open_page(app, "audit")
    assert errors(app) == [
        "cannot read the audit log: no API key: sign in with one in the sidebar (`kvcentric up` "
        "prints it at start as KVC_API_KEY and keeps it in data/secrets.env)"
    ]


def test_a_prediction_caption_names_its_window_and_an_unchanged_split_once() -> None:
    prediction = {
        "trace": {"num_rows": 566, "start_s": 1_800_000_000.0, "end_s": 1_800_000_600.0},
        "profile": "live",
        "split": {"baseline": "2:1", "candidate": "2:1"},
        "config_change": {"kvcache_balancing_threshold": 1.0},
    }
    caption = prediction_caption(prediction)
    assert caption == (
        f"Twin run on the recorded window {fmt.clock(1_800_000_000.0)} to "
        f"{fmt.clock(1_800_000_600.0)} (566 requests), profile live; P:D 2:1 (unchanged); "
        "change: kvcache_balancing_threshold=1"
    )
    moved = prediction_caption({**prediction, "split": {"baseline": "2:1", "candidate": "1:2"}})
    assert "P:D 2:1 -> 1:2" in moved
