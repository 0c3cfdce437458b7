"""The sidebar's connection (backend URL, sign-in) and the BackendClient every page calls.

No secret ever reaches the browser. The API key the console was started with
(`kvcentric console --api-key`, or the secrets file) stays in this server process and is
used for reads; without one the operator signs in with an API key. Changes need the admin
token, which the console is never given: the operator signs in with it in each browser
session. What the operator types goes into a form that is cleared on submit, and is kept in
that session's server-side state only (Streamlit sends widget values to the browser, never
the rest of the session state), so no page shows or echoes it back.
"""

import streamlit as st

from console.client import BackendClient, BackendError
from console.settings import ConsoleSettings

URL_KEY = "backend_url"
SETTINGS_KEY = "console_settings"
# Server-side only: no widget has these keys, so their values never leave this process.
SIGNED_IN_API_KEY = "_signed_in_api_key"
SIGNED_IN_ADMIN_TOKEN = "_signed_in_admin_token"
# The sign-in forms' password fields (cleared on submit).
API_KEY_ENTRY = "api_key_entry"
ADMIN_TOKEN_ENTRY = "admin_token_entry"


def settings() -> ConsoleSettings:
    """The console's settings, read from the environment once per session."""
    if SETTINGS_KEY not in st.session_state:
        st.session_state[SETTINGS_KEY] = ConsoleSettings.from_env()
    return st.session_state[SETTINGS_KEY]


def connection_sidebar() -> None:
    """The backend's URL and the sign-ins; a page reads them through `client()`."""
    st.session_state.setdefault(URL_KEY, settings().backend_url)
    with st.sidebar:
        st.subheader("Backend")
        st.text_input("Backend URL", key=URL_KEY, help="The Conductor's REST address.")
        _api_key_sign_in()
        _admin_sign_in()


def _api_key_sign_in() -> None:
    if settings().api_key:
        st.caption("Reads with the API key this console was started with.")
        return
    if st.session_state.get(SIGNED_IN_API_KEY):
        st.caption("Reads with the API key you signed in with.")
        if st.button("Sign out", key="sign_out_api_key"):
            del st.session_state[SIGNED_IN_API_KEY]
            st.rerun()
        return
    with st.form("api_key_sign_in", clear_on_submit=True, border=False):
        st.text_input(
            "API key",
            key=API_KEY_ENTRY,
            type="password",
            help="Any API key of the Conductor (KVC_API_KEYS); kept for this browser session only.",
        )
        if st.form_submit_button("Sign in"):
            st.session_state[SIGNED_IN_API_KEY] = str(st.session_state[API_KEY_ENTRY]).strip()
            st.rerun()


def _admin_sign_in() -> None:
    if st.session_state.get(SIGNED_IN_ADMIN_TOKEN):
        st.caption("Signed in as admin for this browser session: changes can be applied.")
        if st.button("Sign out as admin", key="sign_out_admin"):
            del st.session_state[SIGNED_IN_ADMIN_TOKEN]
            st.rerun()
        return
    with st.form("admin_sign_in", clear_on_submit=True, border=False):
        st.text_input(
            "Admin token",
            key=ADMIN_TOKEN_ENTRY,
            type="password",
            help="Needed only to apply changes (configuration, agent roles); checked with "
            "the Conductor and kept for this browser session only.",
        )
        if st.form_submit_button("Sign in as admin"):
            token = str(st.session_state[ADMIN_TOKEN_ENTRY]).strip()
            try:
                BackendClient(_url(), admin_token=token).check_admin()
            except BackendError as error:
                show_error(error, "Admin sign-in")
                return
            st.session_state[SIGNED_IN_ADMIN_TOKEN] = token
            st.rerun()


def _url() -> str:
    return str(st.session_state.get(URL_KEY, settings().backend_url)).strip()


def client() -> BackendClient:
    return BackendClient(
        base_url=_url(),
        api_key=settings().api_key or str(st.session_state.get(SIGNED_IN_API_KEY, "")),
        admin_token=str(st.session_state.get(SIGNED_IN_ADMIN_TOKEN, "")),
    )


def show_error(error: BackendError, what: str = "") -> None:
    """The error as one readable line (never a traceback)."""
    st.error(f"{what}: {error}" if what else str(error), icon=":material/error:")


__all__ = ["BackendError", "client", "connection_sidebar", "settings", "show_error"]
