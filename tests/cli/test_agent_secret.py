"""One minimum secret length everywhere: an agent refuses a shared secret shorter than the
Conductor accepts, with one line naming the rule, before it loads a model or binds a port."""

from typer.testing import CliRunner

from backend.cli import app
from backend.settings.conductor import MIN_SECRET_CHARS


def test_an_agent_refuses_a_short_secret_with_one_line_and_exit_2() -> None:
    args = ["agent", "--role", "prefill", "--listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0"]
    args += ["--secret", "x" * (MIN_SECRET_CHARS - 1)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert f"at least {MIN_SECRET_CHARS} characters" in result.output
    assert "Traceback" not in result.output
