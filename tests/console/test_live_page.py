"""The Live page against the real backend: its figures are GET /v1/report's, and a backend
that cannot be reached, or refuses the key, is one readable error, not a traceback."""

import pytest

from tests.console.conftest import ADMIN_TOKEN, API_KEY, NUM_COMPLETED, NUM_REJECTED, free_port
from tests.console.pages import (
    errors,
    metrics,
    num_charts,
    open_page,
    shown_as_in,
    sign_in_as_admin,
    widget_and_text_values,
)

WINDOW_S = 300.0  # the page's default window
# Label on the page -> the report's key.
COUNTS_AND_LATENCIES = {
    "Requests": "num_requests",
    "Completed": "num_completed",
    "Rejected": "num_rejected",
    "Failed": "num_failed",
    "Cancelled": "num_cancelled",
    "Goodput": "goodput_rps",
    "SLO attainment": "slo_attainment",
    "Wasted prefill tokens": "wasted_prefill_tokens",
    "Wasted prefill time": "wasted_prefill_s",
    "TTFT p50": "ttft_p50_s",
    "TTFT p90": "ttft_p90_s",
    "TTFT p99": "ttft_p99_s",
    "TBT p50": "tbt_p50_s",
    "TBT p90": "tbt_p90_s",
    "TBT p99": "tbt_p99_s",
}
LOADS = {
    "Prefill load amplitude": "prefill_load_amplitude",
    "Prefill load period": "prefill_load_period_s",
    "Decode load amplitude": "decode_load_amplitude",
    "Decode load period": "decode_load_period_s",
}


def test_the_live_figures_are_the_backends_report(app, backend):
    before = backend.get("/v1/report", window_s=WINDOW_S)
    shown = metrics(open_page(app, "live"))
    after = backend.get("/v1/report", window_s=WINDOW_S)
    # The fixture's traffic (more with KVC_UPDATE_SCREENSHOTS=1: the browser test replays).
    assert before["num_completed"] >= NUM_COMPLETED and before["num_rejected"] >= NUM_REJECTED
    for label, key in {**COUNTS_AND_LATENCIES, **LOADS}.items():
        assert shown_as_in(shown[label], key, [before, after]), label
    assert not errors(app)


def test_rejections_by_stage_and_reason_and_the_four_charts(app, backend):
    open_page(app, "live")
    report = backend.get("/v1/report", window_s=WINDOW_S)
    rows = app.dataframe[0].value.to_dict("records")
    assert {(row["stage"], row["reason"]): row["requests"] for row in rows} == {
        tuple(key.split(":", 1)): count for key, count in report["rejected_by_reason"].items()
    }
    assert sum(row["requests"] for row in rows) == report["num_rejected"] >= NUM_REJECTED
    # Pool load, admissions/rejections, TTFT and TBT against their SLOs.
    assert num_charts(app) == 4


def test_another_window_asks_the_backend_for_that_window(app, backend):
    open_page(app, "live")
    before = backend.get("/v1/report", window_s=3600.0)
    app.selectbox(key="window").set_value("last 1 h").run()
    after = backend.get("/v1/report", window_s=3600.0)
    shown = metrics(app)
    assert shown_as_in(shown["Requests"], "num_requests", [before, after])
    assert shown_as_in(shown["Goodput"], "goodput_rps", [before, after])  # good / 3600 s
    assert "series every 60.00 s" in app.caption[0].value


def test_an_unreachable_backend_is_a_readable_error(app, monkeypatch):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("KVC_CONSOLE_BACKEND", url)
    open_page(app, "live")
    assert errors(app) == [
        f"cannot read the live report: cannot reach the backend at {url} (connection "
        "refused); is `kvcentric conductor` running there?"
    ]
    assert not app.metric


def test_a_wrong_api_key_is_a_readable_401(app, monkeypatch):
    monkeypatch.setenv("KVC_CONSOLE_API_KEY", "not-a-key")
    open_page(app, "live")
    (message,) = errors(app)
    assert "refused the credentials (401 unauthorized): invalid credentials" in message
    assert message.endswith("Check the console's --api-key or the key you signed in with.")


@pytest.mark.parametrize("page", ["live", "cache", "agents", "whatif", "audit"])
def test_no_page_carries_a_secret_and_admin_sign_in_is_checked(app, backend, page):
    """The API key the console holds and the admin token an operator signs in with stay in
    the server process: no widget value and no text of any page holds them."""
    open_page(app, page)
    fields = {field.label: field for field in app.sidebar.text_input}
    assert fields["Backend URL"].value == backend.url
    assert "API key" not in fields  # the console's own key reads; no field for it
    assert fields["Admin token"].proto.type == fields["Admin token"].proto.PASSWORD
    sign_in_as_admin(app, "not-the-admin-token")
    assert any("Admin sign-in: the backend refused the credentials" in e for e in errors(app))
    assert "_signed_in_admin_token" not in app.session_state
    sign_in_as_admin(app, ADMIN_TOKEN)
    assert not errors(app)
    assert any("Signed in as admin" in caption.value for caption in app.sidebar.caption)
    assert "Admin token" not in {field.label for field in app.sidebar.text_input}
    shown = widget_and_text_values(app)
    assert shown and not [value for value in shown if API_KEY in value or ADMIN_TOKEN in value]


def test_the_window_stays_chosen_on_the_other_pages(app):
    open_page(app, "live")
    app.selectbox(key="window").set_value("last 1 h").run()
    app.switch_page("views/cache.py").run()
    assert app.selectbox(key="window").value == "last 1 h"
    app.switch_page("views/live.py").run()
    assert app.selectbox(key="window").value == "last 1 h"
    assert "series every 60.00 s" in app.caption[0].value
