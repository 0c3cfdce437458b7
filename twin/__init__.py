"""The digital twin: a SimPy cluster that drives the live Conductor's own policy core.

The twin executes work with its own timing model (twin/timing.py), separate from the cost
model the policy believes, so it can show the policy's mispredictions.
"""
