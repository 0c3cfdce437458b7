"""The gRPC control plane shared by the Conductor and the node agents.

`agent.proto` is the one wire contract; `agent_pb2*.py` are generated from it
(`python -m backend.rpc.regenerate`); `convert` is the one place where its messages and the
policy's dataclasses turn into each other; `auth` names how the shared secret travels.
"""
