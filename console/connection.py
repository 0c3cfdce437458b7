"""The sidebar's connection settings (backend URL, API key, admin token), kept in the session
state and pre-filled once from ConsoleSettings, and the BackendClient every page calls."""

import streamlit as st

from console.client import BackendClient, BackendError
from console.settings import ConsoleSettings

URL_KEY = "backend_url"
API_KEY_KEY = "api_key"
ADMIN_TOKEN_KEY = "admin_token"
SETTINGS_KEY = "console_settings"


def settings() -> ConsoleSettings:
    """The console's settings, read from the environment once per session."""
    if SETTINGS_KEY not in st.session_state:
        st.session_state[SETTINGS_KEY] = ConsoleSettings.from_env()
    return st.session_state[SETTINGS_KEY]


def connection_sidebar() -> None:
    """The three connection fields; a page reads them through `client()`."""
    defaults = settings()
    for key, value in (
        (URL_KEY, defaults.backend_url),
        (API_KEY_KEY, defaults.api_key),
        (ADMIN_TOKEN_KEY, defaults.admin_token),
    ):
        st.session_state.setdefault(key, value)
    with st.sidebar:
        st.subheader("Backend")
        st.text_input("Backend URL", key=URL_KEY, help="The Conductor's REST address.")
        st.text_input("API key", key=API_KEY_KEY, type="password", help="Reads: any API key works.")
        st.text_input(
            "Admin token",
            key=ADMIN_TOKEN_KEY,
            type="password",
            help="Needed only to apply changes (configuration, agent roles).",
        )


def client() -> BackendClient:
    return BackendClient(
        base_url=str(st.session_state.get(URL_KEY, settings().backend_url)).strip(),
        api_key=str(st.session_state.get(API_KEY_KEY, "")).strip(),
        admin_token=str(st.session_state.get(ADMIN_TOKEN_KEY, "")).strip(),
    )


def show_error(error: BackendError, what: str = "") -> None:
    """The error as one readable line (never a traceback)."""
    st.error(f"{what}: {error}" if what else str(error), icon=":material/error:")


__all__ = ["BackendError", "client", "connection_sidebar", "settings", "show_error"]
