"""Calibration state, and every request's inter-token gaps as a log-binned histogram.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "calibration",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("updated_time_s", sa.Double(), nullable=False),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_calibration")),
    )
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("tbt_gap_histogram", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("tbt_gap_histogram")
    op.drop_table("calibration")
