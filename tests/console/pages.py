"""Helpers of the page tests: open a page of the console app and read what it shows."""

from streamlit.testing.v1 import AppTest

from console import format as fmt


def open_page(app: AppTest, page: str) -> AppTest:
    """Run the app, then switch to `page` ("live", "cache", ...) and run it; the run must end
    without an uncaught exception (the console shows errors, never tracebacks)."""
    app.run()
    if page != "live":
        app.switch_page(f"views/{page}.py").run()
    assert not app.exception, [e.value for e in app.exception]
    return app


def metrics(app: AppTest) -> dict[str, str]:
    return {metric.label: metric.value for metric in app.metric}


def errors(app: AppTest) -> list[str]:
    return [error.value for error in app.error]


def shown_as_in(shown: str, key: str, reports: list[dict]) -> bool:
    """Whether `shown` writes `key` of one of `reports` (read just before and just after the
    page: recent traffic may still move a window's figures in between)."""
    return shown in {fmt.metric(key, report[key]) for report in reports}


def num_charts(app: AppTest) -> int:
    return len(app.get("plotly_chart"))


def sign_in_as_admin(app: AppTest, token: str) -> AppTest:
    """Type `token` into the sidebar's admin sign-in form and submit it, as an operator does."""
    app.sidebar.text_input(key="admin_token_entry").set_value(token)
    (submit,) = [button for button in app.sidebar.button if button.label == "Sign in as admin"]
    return submit.click().run()


def widget_and_text_values(app: AppTest) -> list[str]:
    """Every value a page shows or holds in a widget (what Streamlit sends to the browser)."""
    shown: list[str] = []
    for kind in ("text_input", "markdown", "caption", "error", "success", "warning", "info"):
        shown += [str(getattr(element, "value", "")) for element in app.get(kind)]
    return shown
