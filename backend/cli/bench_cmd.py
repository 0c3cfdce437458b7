"""`kvcentric bench ...`: benchmarks of the policy core and block hashing."""

import typer

bench_app = typer.Typer(help="Benchmarks whose figures go in docs/benchmarks.md.", no_args_is_help=True)
