"""The Alembic migrations build exactly the schema the models describe, on both databases."""

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Column, Integer, MetaData, Table, inspect

from backend.db.models import Base
from backend.db.session import alembic_config, create_db_engine, run_migrations
from tests.db.conftest import BACKENDS

pytestmark = pytest.mark.parametrize("fresh_database_url", BACKENDS, indirect=True)


def test_migrations_create_every_table_and_match_the_models(fresh_database_url: str) -> None:
    run_migrations(fresh_database_url)
    run_migrations(fresh_database_url)  # a second start finds nothing to do
    engine = create_db_engine(fresh_database_url)
    try:
        with engine.connect() as connection:
            tables = set(inspect(connection).get_table_names())
            assert tables == {*Base.metadata.tables, "alembic_version"}
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            head = ScriptDirectory.from_config(
                alembic_config(fresh_database_url)
            ).get_current_head()
            assert context.get_current_revision() == head
            # What `alembic check` does: autogenerate would write no migration.
            assert compare_metadata(context, Base.metadata) == []
            drifted = MetaData()
            for table in Base.metadata.tables.values():
                table.to_metadata(drifted)
            Table("not_migrated", drifted, Column("id", Integer, primary_key=True))
            assert [diff[0] for diff in compare_metadata(context, drifted)] == ["add_table"]
    finally:
        engine.dispose()


def test_migrations_downgrade_to_an_empty_database(fresh_database_url: str) -> None:
    run_migrations(fresh_database_url)
    engine = create_db_engine(fresh_database_url)
    try:
        with engine.begin() as connection:
            config = alembic_config(fresh_database_url)
            config.attributes["connection"] = connection
            command.downgrade(config, "base")
        with engine.connect() as connection:
            assert set(inspect(connection).get_table_names()) <= {"alembic_version"}
    finally:
        engine.dispose()
