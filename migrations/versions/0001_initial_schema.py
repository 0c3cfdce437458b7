"""Initial schema: requests, decisions, agents, load samples, config versions, audit log.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "agents",
        sa.Column("instance_id", sa.String(length=128), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("rpc_address", sa.String(length=255), nullable=False),
        sa.Column("data_address", sa.String(length=255), nullable=True),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("joined_time_s", sa.Double(), nullable=False),
        sa.Column("left_time_s", sa.Double(), nullable=True),
        sa.Column("last_heartbeat_time_s", sa.Double(), nullable=True),
        sa.CheckConstraint("role IN ('prefill', 'decode')", name=op.f("ck_agents_agent_role")),
        sa.PrimaryKeyConstraint("instance_id", name=op.f("pk_agents")),
    )
    op.create_table(
        "config_versions",
        sa.Column("version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("created_time_s", sa.Double(), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("version", name=op.f("pk_config_versions")),
    )
    op.create_index(
        op.f("ix_config_versions_created_time_s"),
        "config_versions",
        ["created_time_s"],
        unique=False,
    )

    op.create_table(
        "load_samples",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("time_s", sa.Double(), nullable=False),
        sa.Column("instance_id", sa.String(length=128), nullable=False),
        sa.Column("prefill_load_s", sa.Double(), nullable=True),
        sa.Column("decode_load", sa.Double(), nullable=True),
        sa.Column("memory_used_bytes", sa.BigInteger(), nullable=True),
        sa.Column("memory_capacity_bytes", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_load_samples")),
    )
    op.create_index(
        "ix_load_samples_instance_time", "load_samples", ["instance_id", "time_s"], unique=False
    )
    op.create_index(op.f("ix_load_samples_time_s"), "load_samples", ["time_s"], unique=False)

    op.create_table(
        "requests",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("api_key_id", sa.String(length=128), nullable=True),
        sa.Column("api_key_name", sa.String(length=128), nullable=True),
        sa.Column("arrival_time_s", sa.Double(), nullable=False),
        sa.Column("num_input_tokens", sa.Integer(), nullable=False),
        sa.Column("num_output_tokens", sa.Integer(), nullable=False),
        sa.Column("block_size", sa.Integer(), nullable=False),
        sa.Column("num_block_keys", sa.Integer(), nullable=False),
        sa.Column("block_keys", sa.JSON(), nullable=False),
        sa.Column("ttft_slo_s", sa.Double(), nullable=True),
        sa.Column("tbt_slo_s", sa.Double(), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.Column("outcome_reason", sa.String(length=128), nullable=True),
        sa.Column("outcome_stage", sa.String(length=32), nullable=True),
        sa.Column("outcome_message", sa.String(length=1024), nullable=True),
        sa.Column("ttft_s", sa.Double(), nullable=True),
        sa.Column("tbt_mean_s", sa.Double(), nullable=True),
        sa.Column("tbt_p99_s", sa.Double(), nullable=True),
        sa.Column("tbt_max_s", sa.Double(), nullable=True),
        sa.Column("num_generated_tokens", sa.Integer(), nullable=True),
        sa.Column("num_reused_tokens", sa.Integer(), nullable=True),
        sa.Column("num_transferred_tokens", sa.Integer(), nullable=True),
        sa.Column("finished_time_s", sa.Double(), nullable=True),
        sa.CheckConstraint(
            "outcome IS NULL OR outcome IN ('completed', 'rejected', 'failed')",
            name=op.f("ck_requests_outcome_state"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_requests")),
    )
    op.create_index(
        op.f("ix_requests_arrival_time_s"), "requests", ["arrival_time_s"], unique=False
    )
    op.create_index(
        op.f("ix_requests_finished_time_s"), "requests", ["finished_time_s"], unique=False
    )

    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("time_s", sa.Double(), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("action", sa.String(length=128), nullable=False),
        sa.Column("old_value", sa.JSON(), nullable=True),
        sa.Column("new_value", sa.JSON(), nullable=True),
        sa.Column("prediction", sa.JSON(), nullable=True),
        sa.Column("config_version", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["config_version"],
            ["config_versions.version"],
            name=op.f("fk_audit_log_config_version_config_versions"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    op.create_index(op.f("ix_audit_log_time_s"), "audit_log", ["time_s"], unique=False)

    op.create_table(
        "decisions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column("decided_time_s", sa.Double(), nullable=False),
        sa.Column("prefill_instance_id", sa.String(length=128), nullable=False),
        sa.Column("decode_instance_id", sa.String(length=128), nullable=False),
        sa.Column("num_local_blocks", sa.Integer(), nullable=False),
        sa.Column("fetch_source_instance_id", sa.String(length=128), nullable=True),
        sa.Column("num_fetch_blocks", sa.Integer(), nullable=False),
        sa.Column("num_reused_tokens", sa.Integer(), nullable=False),
        sa.Column("num_compute_tokens", sa.Integer(), nullable=False),
        sa.Column("estimated_queue_s", sa.Double(), nullable=False),
        sa.Column("estimated_transfer_s", sa.Double(), nullable=False),
        sa.Column("estimated_prefill_s", sa.Double(), nullable=False),
        sa.Column("estimated_ttft_s", sa.Double(), nullable=False),
        sa.Column("actual_ttft_s", sa.Double(), nullable=True),
        sa.Column("candidates", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["request_id"],
            ["requests.id"],
            name=op.f("fk_decisions_request_id_requests"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_decisions")),
    )
    op.create_index(
        op.f("ix_decisions_decided_time_s"), "decisions", ["decided_time_s"], unique=False
    )
    op.create_index(op.f("ix_decisions_request_id"), "decisions", ["request_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_decisions_request_id"), table_name="decisions")
    op.drop_index(op.f("ix_decisions_decided_time_s"), table_name="decisions")

    op.drop_table("decisions")
    op.drop_index(op.f("ix_audit_log_time_s"), table_name="audit_log")

    op.drop_table("audit_log")
    op.drop_index(op.f("ix_requests_finished_time_s"), table_name="requests")
    op.drop_index(op.f("ix_requests_arrival_time_s"), table_name="requests")

    op.drop_table("requests")
    op.drop_index(op.f("ix_load_samples_time_s"), table_name="load_samples")
    op.drop_index("ix_load_samples_instance_time", table_name="load_samples")

    op.drop_table("load_samples")
    op.drop_index(op.f("ix_config_versions_created_time_s"), table_name="config_versions")

    op.drop_table("config_versions")
    op.drop_table("agents")
