"""`kvcentric console`: the operator console, `streamlit run console/app.py` with headless
settings, bound to loopback unless told otherwise. The backend URL, keys and twin profile
reach the app as KVC_CONSOLE_* environment variables (console/settings.py), never on the
streamlit command line where other users of the machine could read them."""

import os
import sys
from pathlib import Path

import typer

from backend.cli.secrets_file import DEFAULT_PATH as DEFAULT_SECRETS_PATH
from backend.cli.secrets_file import read_secrets
from backend.settings.profiles import BUILTIN_PROFILES
from console.settings import (
    DEFAULT_BACKEND_URL,
    DEFAULT_REFRESH_S,
    DEFAULT_TWIN_PROFILE,
    ENV_API_KEY,
    ENV_BACKEND,
    ENV_RAY_ADDRESS,
    ConsoleSettings,
)

APP_PATH = Path(__file__).resolve().parents[2] / "console" / "app.py"
DEFAULT_PORT = 8501
_BUILTIN_PROFILES = tuple(BUILTIN_PROFILES)
_EXIT_BAD_INPUT = 2


def streamlit_command(
    settings: ConsoleSettings, *, host: str, port: int
) -> tuple[list[str], dict[str, str]]:
    """The streamlit command line and the environment to run it in."""
    args = [
        sys.executable, "-m", "streamlit", "run", str(APP_PATH),
        "--server.address", host,
        "--server.port", str(port),
        "--server.headless", "true",
        "--server.fileWatcherType", "none",
        "--server.runOnSave", "false",
        "--browser.gatherUsageStats", "false",
        "--global.developmentMode", "false",
        "--client.toolbarMode", "viewer",
        "--client.showErrorDetails", "none",
    ]  # fmt: skip
    return args, {**os.environ, **settings.to_env()}


def console_command(
    backend: str | None = typer.Option(
        None,
        "--backend",
        envvar=ENV_BACKEND,
        help="The Conductor's REST URL. Default: the --secrets-file's, else "
        f"{DEFAULT_BACKEND_URL}.",
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address the console listens on."),
    port: int = typer.Option(DEFAULT_PORT, "--port", min=1, max=65535, help="Console port."),
    api_key: str = typer.Option(
        "",
        "--api-key",
        envvar=ENV_API_KEY,
        help="The API key the console reads with; it stays in the console's process, never "
        "sent to a browser (without one, operators sign in with a key). Changes need the admin "
        "token, which operators sign in with in their browser: the console is never given it.",
    ),
    secrets_file: Path = typer.Option(
        DEFAULT_SECRETS_PATH,
        "--secrets-file",
        help="Where `kvcentric up` saved the URL and keys: fills what is not given.",
    ),
    twin_profile: str = typer.Option(
        str(DEFAULT_TWIN_PROFILE),
        "--twin-profile",
        help="The what-if twin's timing profile: live (fitted by the Conductor from what its "
        "agents measured), a built-in (tiny-cpu, paper) or a profile JSON from "
        "`kvcentric profile`.",
    ),
    refresh_s: float = typer.Option(
        DEFAULT_REFRESH_S, "--refresh-s", min=0.5, help="Live pages refresh every this often."
    ),
    ray: str | None = typer.Option(
        None,
        "--ray",
        envvar=ENV_RAY_ADDRESS,
        metavar="ADDRESS",
        help="Run the What-if page's twin runs as Ray tasks on this cluster (auto, HOST:PORT "
        "or ray://HOST:10001; needs kvcentric[ray]). Default: local worker processes.",
    ),
) -> None:
    """Serve the operator console (Streamlit) for a running Conductor; Ctrl-C stops it."""
    try:
        saved = read_secrets(secrets_file)
    except (OSError, ValueError) as error:
        typer.echo(f"error: --secrets-file: {error}", err=True)
        raise typer.Exit(_EXIT_BAD_INPUT) from None
    backend = backend or saved.get("KVC_URL") or DEFAULT_BACKEND_URL
    api_key = api_key or saved.get("KVC_API_KEY", "")
    if twin_profile not in (*_BUILTIN_PROFILES, "live") and not Path(twin_profile).is_file():
        typer.echo(f"error: --twin-profile: no file {twin_profile}", err=True)
        raise typer.Exit(_EXIT_BAD_INPUT)
    if not backend.startswith(("http://", "https://")):
        typer.echo(f"error: --backend must be an http(s) URL, got {backend!r}", err=True)
        raise typer.Exit(_EXIT_BAD_INPUT)
    settings = ConsoleSettings(
        backend_url=backend,
        api_key=api_key,
        twin_profile=str(Path(twin_profile).resolve())
        if twin_profile not in (*_BUILTIN_PROFILES, "live")
        else twin_profile,
        refresh_s=refresh_s,
        ray_address=ray,
    )
    args, env = streamlit_command(settings, host=host, port=port)
    typer.echo(f"console: http://{host}:{port} (backend {backend})", err=True)
    sys.stderr.flush()
    os.execve(sys.executable, args, env)  # streamlit handles Ctrl-C and SIGTERM itself
