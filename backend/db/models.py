"""The ORM tables of the Conductor's database (SQLAlchemy 2 typed models); no queries here.

Times are wall-clock epoch seconds stored as double precision (`*_time_s`), the same clock
the policy core receives as `now_s`; that keeps time-window queries and bucketing portable
between SQLite and PostgreSQL. Every time column a window query filters on is indexed.
"""

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Stable constraint names, so migrations can name what they alter on both databases.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

ID_LENGTH = 128
ADDRESS_LENGTH = 255


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class RequestRow(Base):
    """One client request from arrival to its single terminal outcome."""

    __tablename__ = "requests"
    __table_args__ = (
        CheckConstraint(
            "outcome IS NULL OR outcome IN ('completed', 'rejected', 'failed', 'cancelled')",
            name="outcome_state",
        ),
    )

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    api_key_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    api_key_name: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    arrival_time_s: Mapped[float] = mapped_column(Double, index=True)
    num_input_tokens: Mapped[int] = mapped_column(Integer)
    num_output_tokens: Mapped[int] = mapped_column(Integer)
    # Tokens per block key; the trace export regroups keys into the trace's block size.
    block_size: Mapped[int] = mapped_column(Integer)
    num_block_keys: Mapped[int] = mapped_column(Integer)
    # The chained xxh3_64 keys of the prompt's full blocks, in order (unsigned 64-bit
    # integers, so JSON rather than BIGINT, which is signed on PostgreSQL).
    block_keys: Mapped[list[Any]] = mapped_column(JSON)
    ttft_slo_s: Mapped[float | None] = mapped_column(Double)
    tbt_slo_s: Mapped[float | None] = mapped_column(Double)
    # NULL while in flight; set exactly once (see request_log.record_outcome).
    outcome: Mapped[str | None] = mapped_column(String(16))
    outcome_reason: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    outcome_stage: Mapped[str | None] = mapped_column(String(32))
    outcome_message: Mapped[str | None] = mapped_column(String(1024))
    ttft_s: Mapped[float | None] = mapped_column(Double)
    tbt_mean_s: Mapped[float | None] = mapped_column(Double)
    tbt_p99_s: Mapped[float | None] = mapped_column(Double)
    tbt_max_s: Mapped[float | None] = mapped_column(Double)
    # Every inter-token gap, log-binned: {bin index (string): count} (measures.gap_histogram).
    tbt_gap_histogram: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    num_generated_tokens: Mapped[int | None] = mapped_column(Integer)
    num_reused_tokens: Mapped[int | None] = mapped_column(Integer)
    num_transferred_tokens: Mapped[int | None] = mapped_column(Integer)
    finished_time_s: Mapped[float | None] = mapped_column(Double, index=True)


class DecisionRow(Base):
    """One DispatchPrefill: where the request went and what the scheduler predicted.

    A request may have several when it is re-routed (its instance died before starting).
    """

    __tablename__ = "decisions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(
        String(ID_LENGTH), ForeignKey("requests.id", ondelete="CASCADE"), index=True
    )
    decided_time_s: Mapped[float] = mapped_column(Double, index=True)
    prefill_instance_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    decode_instance_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    num_local_blocks: Mapped[int] = mapped_column(Integer)
    fetch_source_instance_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    num_fetch_blocks: Mapped[int] = mapped_column(Integer)
    num_reused_tokens: Mapped[int] = mapped_column(Integer)
    num_compute_tokens: Mapped[int] = mapped_column(Integer)
    estimated_queue_s: Mapped[float] = mapped_column(Double)
    estimated_transfer_s: Mapped[float] = mapped_column(Double)
    estimated_prefill_s: Mapped[float] = mapped_column(Double)
    estimated_ttft_s: Mapped[float] = mapped_column(Double)
    actual_ttft_s: Mapped[float | None] = mapped_column(Double)
    # One object per prefill candidate (InstanceEstimate's fields), for explanations.
    candidates: Mapped[list[Any]] = mapped_column(JSON)


class AgentRow(Base):
    """A node agent the Conductor has seen, and its latest known state."""

    __tablename__ = "agents"
    __table_args__ = (CheckConstraint("role IN ('prefill', 'decode')", name="agent_role"),)

    instance_id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))
    rpc_address: Mapped[str] = mapped_column(String(ADDRESS_LENGTH))
    data_address: Mapped[str | None] = mapped_column(String(ADDRESS_LENGTH))
    # e.g. active, draining, dead, left: the runtime owns the vocabulary.
    state: Mapped[str] = mapped_column(String(32))
    joined_time_s: Mapped[float] = mapped_column(Double)
    left_time_s: Mapped[float | None] = mapped_column(Double)
    last_heartbeat_time_s: Mapped[float | None] = mapped_column(Double)


class LoadSampleRow(Base):
    """One instance's load at one moment, for the console's time series."""

    __tablename__ = "load_samples"
    __table_args__ = (Index("ix_load_samples_instance_time", "instance_id", "time_s"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    time_s: Mapped[float] = mapped_column(Double, index=True)
    instance_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    # Predicted seconds of queued prefill work (T_queue).
    prefill_load_s: Mapped[float | None] = mapped_column(Double)
    # Decode load as the TBT ratio of the running batch (1.0 = at the SLO).
    decode_load: Mapped[float | None] = mapped_column(Double)
    memory_used_bytes: Mapped[int | None] = mapped_column(BigInteger)
    memory_capacity_bytes: Mapped[int | None] = mapped_column(BigInteger)


class ConfigVersionRow(Base):
    """One version of the policy configuration; the highest version is the current one."""

    __tablename__ = "config_versions"

    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_time_s: Mapped[float] = mapped_column(Double, index=True)
    created_by: Mapped[str] = mapped_column(String(ID_LENGTH))


class AuditRow(Base):
    """Who changed what, when, from which value to which (and what the twin predicted)."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    time_s: Mapped[float] = mapped_column(Double, index=True)
    actor: Mapped[str] = mapped_column(String(ID_LENGTH))
    action: Mapped[str] = mapped_column(String(ID_LENGTH))
    old_value: Mapped[Any | None] = mapped_column(JSON)
    new_value: Mapped[Any | None] = mapped_column(JSON)
    # The twin's what-if report for this change, when one was run before applying it.
    prediction: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    config_version: Mapped[int | None] = mapped_column(
        Integer, ForeignKey("config_versions.version", ondelete="SET NULL")
    )


class CalibrationRow(Base):
    """The Conductor's calibration as of its last refit (one row): the cost model it believes
    and its rolling window of measurements, so a restart resumes where it was."""

    __tablename__ = "calibration"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    updated_time_s: Mapped[float] = mapped_column(Double)
    state: Mapped[dict[str, Any]] = mapped_column(JSON)
