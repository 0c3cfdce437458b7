"""The committed gRPC stubs are what backend/rpc/agent.proto generates today."""

from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("agent_pb2.py", "agent_pb2.pyi", "agent_pb2_grpc.py")


def test_stubs_match_the_proto(tmp_path) -> None:
    include = Path(protoc.__file__).parent / "_proto"
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{ROOT}",
            f"-I{include}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            str(ROOT / "backend/rpc/agent.proto"),
        ]
    )
    assert status == 0
    for name in GENERATED:
        fresh = (tmp_path / "backend/rpc" / name).read_text()
        committed = (ROOT / "backend/rpc" / name).read_text()
        assert fresh == committed, f"{name} is stale: run python -m backend.rpc.regenerate"
