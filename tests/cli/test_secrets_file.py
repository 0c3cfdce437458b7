"""The secrets `kvcentric up` saves: a file only the user can read, which `replay` and
`console` fall back on."""

import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from backend.cli import app
from backend.cli.secrets_file import read_secrets, write_secrets


def test_the_file_is_the_users_only_and_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "data" / "secrets.env"
    path.parent.mkdir()
    path.write_text("old")
    path.chmod(0o644)  # an existing file is made private too
    write_secrets(path, {"KVC_URL": "http://127.0.0.1:8000", "KVC_API_KEY": "k=1"})
    assert path.stat().st_mode & 0o777 == 0o600
    assert read_secrets(path) == {"KVC_URL": "http://127.0.0.1:8000", "KVC_API_KEY": "k=1"}
    assert read_secrets(tmp_path / "none.env") == {}


def test_a_file_others_can_read_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = write_secrets(tmp_path / "secrets.env", {"KVC_API_KEY": "k"})
    path.chmod(0o640)
    with pytest.raises(ValueError, match=r"readable by others \(mode 640\); run `chmod 600"):
        read_secrets(path)


def test_replay_takes_the_url_and_key_from_the_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("KVC_API_KEY", raising=False)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, never listening
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        path = write_secrets(tmp_path / "secrets.env", {"KVC_URL": url, "KVC_API_KEY": "k"})
        args = ["replay", "--minutes", "0:0.1", "--wait-s", "0", "--out", str(tmp_path / "r")]
        result = CliRunner().invoke(app, [*args, "--secrets-file", str(path)])
        missing = CliRunner().invoke(app, [*args, "--secrets-file", str(tmp_path / "no.env")])
    assert result.exit_code == 2 and f"cannot reach {url}" in result.stderr
    assert missing.exit_code == 2 and "no API key: pass --api-key" in missing.stderr
