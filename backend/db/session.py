"""Engines, sessions and migrations from a database URL (SQLite file by default, or PostgreSQL).

The Conductor calls `run_migrations(url)` at start, then `create_db_engine(url)` and
`create_session_factory(engine)`; each persistence function takes one Session.
"""

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
DATABASE_FILE_NAME = "kvcentric.db"
SQLITE_BUSY_TIMEOUT_MS = 5_000


def sqlite_url(data_dir: Path | str) -> str:
    """The default database: a SQLite file under the data directory."""
    return f"sqlite:///{Path(data_dir).resolve() / DATABASE_FILE_NAME}"


def create_db_engine(url: str, *, echo: bool = False) -> Engine:
    """An engine for `url`; SQLite gets WAL, foreign keys and a busy timeout on every connection.

    A SQLite file's directory is created when missing. An in-memory SQLite database keeps
    one shared connection (otherwise each connection would see its own empty database).
    """
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        # pre_ping: the Conductor outlives database restarts; recycle: idle-killing proxies.
        return create_engine(
            url, echo=echo, pool_pre_ping=True, pool_size=5, max_overflow=10, pool_recycle=1800
        )
    options: dict[str, Any] = {"connect_args": {"check_same_thread": False}}
    if parsed.database in (None, "", ":memory:"):
        options["poolclass"] = StaticPool
    else:
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, echo=echo, **options)
    event.listen(engine, "connect", _set_sqlite_pragmas)
    return engine


def create_session_factory(engine: Engine) -> sessionmaker[Session]:
    # Records are built before commit returns, so nothing needs reloading afterwards.
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(url: str) -> Config:
    """An Alembic configuration for `url`, built in code (no alembic.ini lookup needed)."""
    config = Config(str(MIGRATIONS_DIR / "alembic.ini"))
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # ConfigParser interpolation treats '%' specially; URL-encoded passwords contain it.
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def run_migrations(url: str, revision: str = "head") -> None:
    """Upgrade the database at `url` to `revision` (creating a SQLite file if needed)."""
    engine = create_db_engine(url)
    try:
        with engine.begin() as connection:
            config = alembic_config(url)
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
    finally:
        engine.dispose()


def _set_sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        if not _is_memory(dbapi_connection):
            cursor.execute("PRAGMA journal_mode=WAL")
            # Safe with WAL: a crash may lose the last commits, never corrupt the file.
            cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


def _is_memory(dbapi_connection: Any) -> bool:
    cursor = dbapi_connection.cursor()
    try:
        rows = cursor.execute("PRAGMA database_list").fetchall()
    finally:
        cursor.close()
    return all(not row[2] for row in rows)
