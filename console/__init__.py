"""The operator console: a Streamlit + plotly app that talks to the Conductor over REST only,
and runs the digital twin locally for what-if previews (`kvcentric console`)."""
