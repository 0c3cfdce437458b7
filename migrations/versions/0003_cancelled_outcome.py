"""A request can end `cancelled` (its client went away or its deadline passed).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NAME = "outcome_state"  # ck_requests_outcome_state under the naming convention


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_constraint(op.f(f"ck_requests_{_NAME}"), type_="check")
        batch.create_check_constraint(
            _NAME, "outcome IS NULL OR outcome IN ('completed', 'rejected', 'failed', 'cancelled')"
        )


def downgrade() -> None:
    op.execute("UPDATE requests SET outcome = 'failed' WHERE outcome = 'cancelled'")
    with op.batch_alter_table("requests") as batch:
        batch.drop_constraint(op.f(f"ck_requests_{_NAME}"), type_="check")
        batch.create_check_constraint(
            _NAME, "outcome IS NULL OR outcome IN ('completed', 'rejected', 'failed')"
        )
