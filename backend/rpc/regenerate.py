"""Regenerate agent_pb2*.py from agent.proto: `python -m backend.rpc.regenerate`.

Run from anywhere; needs grpcio-tools. The generated modules are committed, so neither
the backend nor the agents need grpcio-tools at run time.
"""

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[2]
PROTO = Path("backend/rpc/agent.proto")


def main() -> int:
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{ROOT}",
        f"-I{include}",
        f"--python_out={ROOT}",
        f"--pyi_out={ROOT}",
        f"--grpc_python_out={ROOT}",
        str(ROOT / PROTO),
    ]
    return protoc.main(args)


if __name__ == "__main__":
    sys.exit(main())
