"""`kvcentric conductor`: the backend. Loads the settings (flags > KVC_* > config file),
migrates the database, starts the runtime (gRPC for agents) and serves the REST API with
uvicorn until Ctrl-C or SIGTERM; the last saved configuration is restored at start."""

import logging
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from fastapi import FastAPI
from sqlalchemy import Engine

from backend.cli.quiet_gc import quiet_garbage_collection
from backend.settings import ConductorSettings, SettingsError, load_settings

if TYPE_CHECKING:  # imported when started, so `--help` stays fast
    from backend.policy import CostModel
    from backend.runtime import ConductorRuntime

_EXIT_BAD_INPUT = 2
logger = logging.getLogger(__name__)


@dataclass
class Conductor:
    """A started runtime, its app (database attached) and the engine to dispose at stop."""

    settings: ConductorSettings
    runtime: "ConductorRuntime"
    app: FastAPI
    engine: Engine
    config_version: int

    def stop(self) -> None:
        self.runtime.stop()
        self.engine.dispose()


def cost_model(profile: str | None) -> "CostModel":
    """The policy's cost model from a profile (built-in name or file; None: the paper's
    LLaMA2-70B on 8xA800); ValueError in one line."""
    from backend.policy import CostModel
    from backend.settings.profiles import read_profile

    if profile is None:
        return CostModel.reference_70b()
    data, where = read_profile(profile)
    try:
        return CostModel.from_profile(data)
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{where} has no usable cost model: {error}") from None


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    """Levelled lines on stderr, each with time, level and logger; quiets the libraries that
    narrate their own start (Alembic's plugin setup, one line per plugin)."""
    logging.basicConfig(level=level.upper(), stream=sys.stderr, format=LOG_FORMAT, force=True)
    logging.getLogger("alembic.runtime.plugins").setLevel(
        max(logging.WARNING, logging.getLogger().level)
    )


def start_conductor(settings: ConductorSettings, *, profile: str | None = None) -> Conductor:
    """Migrate, start the runtime on the wall clock and build the app with its database;
    `profile`: the cost model's profile (see `--profile`)."""
    from backend.api.app import create_app
    from backend.api.routes.admin import attach_database
    from backend.db.session import create_db_engine, create_session_factory, run_migrations
    from backend.runtime import ConductorRuntime

    cost = cost_model(profile)
    run_migrations(settings.database_url)
    engine = create_db_engine(settings.database_url)
    sessions = create_session_factory(engine)
    # Wall-clock time: recorded traffic stays comparable across restarts and exportable.
    runtime = ConductorRuntime(settings, cost, clock=time.time, session_factory=sessions)
    runtime.start()
    try:
        app = create_app(
            settings, runtime=runtime, readiness_checks=readiness_checks(runtime, engine)
        )
        version = attach_database(app, sessions, now_s=time.time())
    except BaseException:
        runtime.stop()
        engine.dispose()
        raise
    return Conductor(settings, runtime, app, engine, version)


def readiness_checks(runtime: "ConductorRuntime", engine: Engine) -> dict[str, Any]:
    """/readyz's checks: the database answers, and a prefill and a decode instance serve
    (without both every request would be refused)."""
    import asyncio

    from sqlalchemy import text

    def ping() -> bool:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        return True

    async def database() -> bool:
        return await asyncio.wait_for(asyncio.to_thread(ping), timeout=5)

    async def agents() -> bool:
        return not runtime.missing_roles()

    return {"database": database, "agents": agents}


SECRET_VARIABLES = ("api_keys", "admin_token", "agent_secret")


def _settings_epilog() -> str:
    """Where each setting comes from, and every `KVC_*` variable (from the settings class)."""
    others = [
        f"KVC_{name.upper()}"
        for name in ConductorSettings.model_fields
        if name not in (*SECRET_VARIABLES, "config_file")
    ]
    return (
        "Settings, highest precedence first: these flags, KVC_* environment variables, the "
        "--config TOML file (the same names in lower case), the defaults.\n\n"
        "Secrets come from the environment or the file only (a flag shows in process "
        "listings): KVC_API_KEYS=NAME:KEY[,NAME:KEY...], KVC_ADMIN_TOKEN, "
        "KVC_AGENT_SECRET; --dev generates missing ones.\n\n"
        f"Every other setting: KVC_CONFIG_FILE, {', '.join(others)}.\n\n"
        "Example:\n\n"
        "KVC_API_KEYS=me:$(openssl rand -hex 16) "
        "KVC_ADMIN_TOKEN=$(openssl rand -hex 16) KVC_AGENT_SECRET=$(openssl rand -hex 16) "
        "kvcentric conductor --profile tiny-cpu"
    )


CONDUCTOR_EPILOG = _settings_epilog()


def conductor_command(
    host: str | None = typer.Option(None, "--host", help="REST address (default 127.0.0.1)."),
    port: int | None = typer.Option(None, "--port", help="REST port (default 8000)."),
    grpc_host: str | None = typer.Option(None, "--grpc-host", help="gRPC address for agents."),
    grpc_port: int | None = typer.Option(None, "--grpc-port", help="gRPC port (default 50051)."),
    config: Path | None = typer.Option(None, "--config", help="TOML config file."),
    database_url: str | None = typer.Option(
        None, "--database-url", help="sqlite:// or postgresql:// (default: data/kvcentric.db)."
    ),
    dev: bool | None = typer.Option(
        None, "--dev", help="Development: generate missing secrets and print them once."
    ),
    profile: str | None = typer.Option(
        None,
        "--profile",
        help="The cost model: a built-in profile (tiny-cpu, paper) or a profile JSON file "
        "from `kvcentric profile`. Default: LLaMA2-70B on 8xA800 (the paper's).",
    ),
) -> None:
    """Serve the Conductor: REST API for clients, gRPC for agents; Ctrl-C stops it."""
    flags = {
        "host": host,
        "port": port,
        "grpc_host": grpc_host,
        "grpc_port": grpc_port,
        "database_url": database_url,
        "dev": True if dev else None,
    }
    try:
        settings = load_settings(flags, config)
    except SettingsError as error:
        for line in error.problems:
            typer.echo(f"error: {line}", err=True)
        raise typer.Exit(_EXIT_BAD_INPUT) from None
    try:
        cost_model(profile)  # a bad profile is one line and exit 2, before anything starts
    except ValueError as error:
        typer.echo(f"error: --profile: {error}", err=True)
        raise typer.Exit(_EXIT_BAD_INPUT) from None
    configure_logging(settings.log_level)
    import uvicorn

    try:
        conductor = start_conductor(settings, profile=profile)
    except Exception as error:  # a database or port we cannot use: one line, no traceback
        typer.echo(f"error: cannot start: {type(error).__name__}: {error}", err=True)
        raise typer.Exit(1) from None
    typer.echo(
        f"conductor: REST on http://{settings.host}:{settings.port}, agents join at "
        f"{conductor.runtime.address}, configuration version {conductor.config_version}",
        err=True,
    )
    # uvicorn handles SIGINT/SIGTERM: it stops accepting and finishes responses first.
    server = uvicorn.Server(
        uvicorn.Config(
            conductor.app,
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level,
            log_config=None,  # ours (configure_logging); the access lines are ours too
            access_log=False,
            lifespan="off",
        )
    )
    # uvicorn re-raises the signal it caught once it has shut down; with SIGTERM handled like
    # Ctrl-C, both end up as KeyboardInterrupt here instead of killing the process mid-stop.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    quiet_garbage_collection()
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        conductor.stop()
    typer.echo("conductor: stopped", err=True)
