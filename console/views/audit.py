"""Audit page: the configuration history (GET /v1/audit), newest first: who changed what and
when (old -> new for each setting or agent role), and the what-if prediction each change
came with."""

import streamlit as st

from console import format as fmt
from console import prediction as predictions
from console.connection import BackendError, client, show_error
from console.history import audit_rows, prediction_caption, prediction_rows
from console.widgets import table, wrapped_table

LIMITS = (20, 100, 500)


st.title("Audit")
limit = st.columns([1, 4])[0].selectbox("Entries", LIMITS, index=1, key="audit_limit")
try:
    entries = client().audit(limit=limit)
except BackendError as error:
    show_error(error, "cannot read the audit log")
    st.stop()
st.metric("Entries shown", fmt.count(len(entries)))
# A static table: its cells wrap, so a long "what" or "prediction" is read whole.
wrapped_table(audit_rows(entries), ["time", "who", "action", "version", "what", "prediction"])
with_prediction = [entry for entry in entries if entry["prediction"]]
if with_prediction:
    st.subheader("Predictions")
for index, entry in enumerate(with_prediction):
    title = f"{fmt.clock(entry['time_s'])}: {entry['action']} by {entry['actor']}"
    with st.expander(title, expanded=index == 0):  # the newest open
        prediction = entry["prediction"]
        if predictions.is_console_prediction(prediction):
            st.caption(prediction_caption(prediction))
            table(prediction_rows(prediction))
        st.json(prediction, expanded=False)
