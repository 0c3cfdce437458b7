"""Every page, when the backend cannot be reached or refuses the API key, shows one readable
error (st.error) and no traceback."""

import pytest

from tests.console.conftest import free_port
from tests.console.pages import errors, open_page

PAGES = ("live", "cache", "agents", "whatif", "audit")


@pytest.mark.parametrize("page", PAGES)
def test_an_unreachable_backend(app, monkeypatch, page):
    url = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("KVC_CONSOLE_BACKEND", url)
    shown = errors(open_page(app, page))  # open_page: no uncaught exception
    assert shown
    assert all(f"cannot reach the backend at {url} (connection refused)" in e for e in shown)


@pytest.mark.parametrize("page", PAGES)
def test_a_refused_api_key(app, backend, monkeypatch, page):
    monkeypatch.setenv("KVC_CONSOLE_API_KEY", "not-a-key")
    shown = errors(open_page(app, page))
    assert shown
    assert all("(401 unauthorized): invalid credentials" in e for e in shown)
