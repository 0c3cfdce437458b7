"""Databases for the persistence tests: a fresh SQLite file and a fresh PostgreSQL database.

Both are created by running the Alembic migrations, once per test session; each test
starts from empty tables. PostgreSQL comes from KVC_TEST_POSTGRES_URL (a URL of an existing
database the tests may create databases from; default the local server's `postgres`). When
it is unreachable its tests skip, unless KVC_REQUIRE_POSTGRES=1 (CI) makes that a failure.
"""

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, delete, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from backend.db.models import Base
from backend.db.session import create_db_engine, create_session_factory, run_migrations

POSTGRES_ADMIN_URL = os.environ.get(
    "KVC_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
REQUIRE_POSTGRES = os.environ.get("KVC_REQUIRE_POSTGRES") == "1"
BACKENDS = ("sqlite", "postgresql")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Engine]:
    """An autocommit engine on the PostgreSQL server, for CREATE/DROP DATABASE."""
    admin = create_engine(
        POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3}
    )
    try:
        with admin.connect() as connection:
            connection.execute(text("SELECT 1"))
    except OperationalError as error:
        admin.dispose()
        reason = f"PostgreSQL unreachable at {POSTGRES_ADMIN_URL} ({type(error.orig).__name__})"
        if REQUIRE_POSTGRES:
            pytest.fail(f"{reason}, and KVC_REQUIRE_POSTGRES=1")
        pytest.skip(f"{reason}; set KVC_TEST_POSTGRES_URL to test on PostgreSQL")
    yield admin
    admin.dispose()


def create_postgres_database(server: Engine) -> str:
    """A new, empty database with a unique name; returns its URL."""
    name = f"kvc_test_{uuid.uuid4().hex[:12]}"
    with server.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    return make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(hide_password=False)


def drop_postgres_database(server: Engine, url: str) -> None:
    name = make_url(url).database
    with server.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def fresh_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty, unmigrated database of the backend named by the test's `backend` param."""
    backend = request.param
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    server = request.getfixturevalue("postgres_server")
    url = create_postgres_database(server)
    try:
        yield url
    finally:
        drop_postgres_database(server, url)


@pytest.fixture(scope="session", params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """A database migrated to head, shared by the session's tests of one backend."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'kvcentric.db'}"
        run_migrations(url)
        yield url
        return
    server = request.getfixturevalue("postgres_server")
    url = create_postgres_database(server)
    try:
        run_migrations(url)
        yield url
    finally:
        drop_postgres_database(server, url)


@pytest.fixture(scope="session")
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_db_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    """A session on empty tables (rows of earlier tests deleted, children first)."""
    with engine.begin() as connection:
        for table in reversed(Base.metadata.sorted_tables):
            connection.execute(delete(table))
    factory = create_session_factory(engine)
    with factory() as session:
        yield session
