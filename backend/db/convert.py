"""The one place ORM rows and plain records meet: every row <-> record mapping lives here."""

from typing import Any

from backend.db.models import (
    AgentRow,
    AuditRow,
    ConfigVersionRow,
    DecisionRow,
    LoadSampleRow,
    RequestRow,
)
from backend.db.records import (
    AgentRecord,
    AuditEntry,
    ConfigVersion,
    DecisionRecord,
    LoadSample,
    RequestOutcome,
    RequestRecord,
)
from backend.policy.effects import DispatchPrefill, InstanceEstimate
from backend.policy.events import RequestArrived


def request_row(
    arrival: RequestArrived, *, block_size: int, api_key_id: str | None, api_key_name: str | None
) -> RequestRow:
    return RequestRow(
        id=arrival.request_id,
        api_key_id=api_key_id,
        api_key_name=api_key_name,
        arrival_time_s=arrival.now_s,
        num_input_tokens=arrival.num_input_tokens,
        num_output_tokens=arrival.num_output_tokens,
        block_size=block_size,
        num_block_keys=len(arrival.block_keys),
        block_keys=list(arrival.block_keys),
        ttft_slo_s=arrival.ttft_slo_s,
        tbt_slo_s=arrival.tbt_slo_s,
    )


def outcome_columns(outcome: RequestOutcome) -> dict[str, Any]:
    """The requests columns an outcome sets, for one guarded UPDATE."""
    return {
        "outcome": outcome.state,
        "outcome_reason": outcome.reason,
        "outcome_stage": outcome.stage,
        "outcome_message": outcome.message,
        "ttft_s": outcome.ttft_s,
        "tbt_mean_s": outcome.tbt_mean_s,
        "tbt_p99_s": outcome.tbt_p99_s,
        "tbt_max_s": outcome.tbt_max_s,
        "tbt_gap_histogram": {str(k): v for k, v in outcome.tbt_gap_histogram.items()}
        if outcome.tbt_gap_histogram is not None
        else None,
        "num_generated_tokens": outcome.num_generated_tokens,
        "num_reused_tokens": outcome.num_reused_tokens,
        "num_transferred_tokens": outcome.num_transferred_tokens,
        "finished_time_s": outcome.finished_time_s,
    }


def request_record(row: RequestRow) -> RequestRecord:
    outcome = None
    if row.outcome is not None:
        outcome = RequestOutcome(
            state=row.outcome,  # type: ignore[arg-type]  # the CHECK constraint holds it
            finished_time_s=row.finished_time_s if row.finished_time_s is not None else 0.0,
            reason=row.outcome_reason,
            stage=row.outcome_stage,
            message=row.outcome_message,
            ttft_s=row.ttft_s,
            tbt_mean_s=row.tbt_mean_s,
            tbt_p99_s=row.tbt_p99_s,
            tbt_max_s=row.tbt_max_s,
            tbt_gap_histogram={int(k): v for k, v in row.tbt_gap_histogram.items()}
            if row.tbt_gap_histogram
            else None,
            num_generated_tokens=row.num_generated_tokens,
            num_reused_tokens=row.num_reused_tokens,
            num_transferred_tokens=row.num_transferred_tokens,
        )
    return RequestRecord(
        request_id=row.id,
        api_key_id=row.api_key_id,
        api_key_name=row.api_key_name,
        arrival_time_s=row.arrival_time_s,
        num_input_tokens=row.num_input_tokens,
        num_output_tokens=row.num_output_tokens,
        block_size=row.block_size,
        block_keys=tuple(int(key) for key in row.block_keys),
        ttft_slo_s=row.ttft_slo_s,
        tbt_slo_s=row.tbt_slo_s,
        outcome=outcome,
    )


def decision_row(decision: DispatchPrefill, *, now_s: float) -> DecisionRow:
    plan = decision.plan
    return DecisionRow(
        request_id=decision.request_id,
        decided_time_s=now_s,
        prefill_instance_id=decision.instance_id,
        decode_instance_id=decision.decode_instance_id,
        num_local_blocks=len(plan.local_keys),
        fetch_source_instance_id=plan.fetch.source_instance_id if plan.fetch else None,
        num_fetch_blocks=len(plan.fetch.keys) if plan.fetch else 0,
        num_reused_tokens=plan.num_reused_tokens,
        num_compute_tokens=plan.num_compute_tokens,
        estimated_queue_s=decision.estimated_queue_s,
        estimated_transfer_s=decision.estimated_transfer_s,
        estimated_prefill_s=decision.estimated_prefill_s,
        estimated_ttft_s=decision.estimated_ttft_s,
        candidates=[candidate._asdict() for candidate in decision.candidates],
    )


def decision_record(row: DecisionRow) -> DecisionRecord:
    return DecisionRecord(
        decision_id=row.id,
        request_id=row.request_id,
        decided_time_s=row.decided_time_s,
        prefill_instance_id=row.prefill_instance_id,
        decode_instance_id=row.decode_instance_id,
        num_local_blocks=row.num_local_blocks,
        fetch_source_instance_id=row.fetch_source_instance_id,
        num_fetch_blocks=row.num_fetch_blocks,
        num_reused_tokens=row.num_reused_tokens,
        num_compute_tokens=row.num_compute_tokens,
        estimated_queue_s=row.estimated_queue_s,
        estimated_transfer_s=row.estimated_transfer_s,
        estimated_prefill_s=row.estimated_prefill_s,
        estimated_ttft_s=row.estimated_ttft_s,
        actual_ttft_s=row.actual_ttft_s,
        candidates=tuple(InstanceEstimate(**candidate) for candidate in row.candidates),
    )


def agent_record(row: AgentRow) -> AgentRecord:
    return AgentRecord(
        instance_id=row.instance_id,
        role=row.role,  # type: ignore[arg-type]  # the CHECK constraint holds it
        rpc_address=row.rpc_address,
        data_address=row.data_address,
        state=row.state,
        joined_time_s=row.joined_time_s,
        left_time_s=row.left_time_s,
        last_heartbeat_time_s=row.last_heartbeat_time_s,
    )


def load_sample_row(sample: LoadSample) -> dict[str, Any]:
    """Column values of one sample, for a bulk INSERT."""
    return {
        "time_s": sample.time_s,
        "instance_id": sample.instance_id,
        "prefill_load_s": sample.prefill_load_s,
        "decode_load": sample.decode_load,
        "memory_used_bytes": sample.memory_used_bytes,
        "memory_capacity_bytes": sample.memory_capacity_bytes,
    }


def load_sample(row: LoadSampleRow) -> LoadSample:
    return LoadSample(
        time_s=row.time_s,
        instance_id=row.instance_id,
        prefill_load_s=row.prefill_load_s,
        decode_load=row.decode_load,
        memory_used_bytes=row.memory_used_bytes,
        memory_capacity_bytes=row.memory_capacity_bytes,
    )


def config_version(row: ConfigVersionRow) -> ConfigVersion:
    return ConfigVersion(
        version=row.version,
        config=dict(row.config),
        created_time_s=row.created_time_s,
        created_by=row.created_by,
    )


def audit_entry(row: AuditRow) -> AuditEntry:
    return AuditEntry(
        entry_id=row.id,
        time_s=row.time_s,
        actor=row.actor,
        action=row.action,
        old_value=row.old_value,
        new_value=row.new_value,
        prediction=row.prediction,
        config_version=row.config_version,
    )
