"""`kvcentric trace ...`: statistics and cache simulation of Mooncake-format traces."""

import typer

trace_app = typer.Typer(help="Inspect Mooncake-format JSONL traces.", no_args_is_help=True)
