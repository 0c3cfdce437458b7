"""The `kvcentric` command line: one typer app, one sub-app per part."""

import typer
from typer.core import TyperOption

from backend.cli import (
    bench_agents_cmd,  # noqa: F401  (adds the agents' benchmarks)
    bench_whatif_cmd,  # noqa: F401  (adds the console's what-if benchmark)
)
from backend.cli.agent_cmd import agent_command
from backend.cli.bench_cmd import bench_app
from backend.cli.chaos_cmd import chaos_command
from backend.cli.conductor_cmd import CONDUCTOR_EPILOG, conductor_command
from backend.cli.console_cmd import console_command
from backend.cli.profile_cmd import profile
from backend.cli.replay_cmd import replay_command
from backend.cli.trace_cmd import trace_app
from backend.cli.twin_cmd import twin_app
from backend.cli.up_cmd import up_command

_display_type_rich = TyperOption.display_type_rich


def _no_type_for_flags(self: TyperOption, ctx: typer.Context) -> str | None:
    """typer 0.29 prints `<bool>` after flags that take no value (`--help <bool>`)."""
    return None if self.is_flag else _display_type_rich(self, ctx)


TyperOption.display_type_rich = _no_type_for_flags  # type: ignore[method-assign]

app = typer.Typer(
    name="kvcentric",
    help="kvcentric: a KVCache-centric LLM serving control plane (after Mooncake, FAST'25).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(trace_app, name="trace")
app.add_typer(bench_app, name="bench")
app.add_typer(twin_app, name="twin")
app.command("agent")(agent_command)
app.command("chaos")(chaos_command)
app.command("conductor", epilog=CONDUCTOR_EPILOG)(conductor_command)
app.command("console")(console_command)
app.command("profile")(profile)
app.command("replay")(replay_command)
app.command("up")(up_command)


def main() -> None:
    """Entry point of the `kvcentric` console script."""
    app()
