"""Alembic environment: migrates the database run_migrations hands over, or a URL.

`backend.db.session.run_migrations(url)` passes an open connection in
`config.attributes["connection"]`; the alembic command line falls back to the configured
`sqlalchemy.url`, then to KVC_DATABASE_URL, then to the default SQLite file.
"""

import os

from alembic import context
from sqlalchemy import Connection

from backend.db.models import Base
from backend.db.session import create_db_engine

config = context.config
target_metadata = Base.metadata
DEFAULT_URL = "sqlite:///data/kvcentric.db"


def _database_url() -> str:
    return (
        config.get_main_option("sqlalchemy.url")
        or os.environ.get("KVC_DATABASE_URL")
        or DEFAULT_URL
    )


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite alters tables by copying them; batch mode makes that automatic.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def run_migrations_offline() -> None:
    context.configure(
        url=_database_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_db_engine(_database_url())
    try:
        with engine.connect() as connection:
            _configure(connection)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
