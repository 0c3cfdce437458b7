"""The console's pages, one Streamlit script each, run by `console/app.py`'s navigation (a
package only so that installs carry them; nothing imports them)."""
