"""The console's entry script (`streamlit run console/app.py`, or `kvcentric console`): the
page setup, the connection sidebar and the navigation over the five pages."""

from pathlib import Path

import streamlit as st

from console.connection import connection_sidebar

# Not "pages/": next to the entry script that name turns on Streamlit's legacy multipage
# mode, which runs a page without this script (and its sidebar).
VIEWS_DIR = Path(__file__).parent / "views"


def main() -> None:
    st.set_page_config(page_title="kvcentric console", page_icon=":material/hub:", layout="wide")
    navigation = st.navigation(
        [
            st.Page(
                VIEWS_DIR / "live.py", title="Live", icon=":material/monitoring:", default=True
            ),
            st.Page(VIEWS_DIR / "cache.py", title="Cache", icon=":material/storage:"),
            st.Page(VIEWS_DIR / "agents.py", title="Agents", icon=":material/dns:"),
            st.Page(VIEWS_DIR / "whatif.py", title="What-if", icon=":material/science:"),
            st.Page(VIEWS_DIR / "audit.py", title="Audit", icon=":material/history:"),
        ]
    )
    connection_sidebar()
    navigation.run()


# Streamlit runs this file as the __main__ module, so the what-if's twin worker processes
# (forkserver) re-run it as "__mp_main__" when they start: they must not draw the app.
if __name__ == "__main__":
    main()
