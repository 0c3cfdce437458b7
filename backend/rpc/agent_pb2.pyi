from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    PREFILL: _ClassVar[Role]
    DECODE: _ClassVar[Role]

class Tier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIER_UNSPECIFIED: _ClassVar[Tier]
    DRAM: _ClassVar[Tier]
    SSD: _ClassVar[Tier]
ROLE_UNSPECIFIED: Role
PREFILL: Role
DECODE: Role
TIER_UNSPECIFIED: Tier
DRAM: Tier
SSD: Tier

class FetchSpan(_message.Message):
    __slots__ = ("source_instance_id", "source_data_address", "keys")
    SOURCE_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    source_instance_id: str
    source_data_address: str
    keys: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, source_instance_id: _Optional[str] = ..., source_data_address: _Optional[str] = ..., keys: _Optional[_Iterable[int]] = ...) -> None: ...

class CachePlan(_message.Message):
    __slots__ = ("local_keys", "fetch", "num_reused_tokens", "num_compute_tokens")
    LOCAL_KEYS_FIELD_NUMBER: _ClassVar[int]
    FETCH_FIELD_NUMBER: _ClassVar[int]
    NUM_REUSED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPUTE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    local_keys: _containers.RepeatedScalarFieldContainer[int]
    fetch: FetchSpan
    num_reused_tokens: int
    num_compute_tokens: int
    def __init__(self, local_keys: _Optional[_Iterable[int]] = ..., fetch: _Optional[_Union[FetchSpan, _Mapping]] = ..., num_reused_tokens: _Optional[int] = ..., num_compute_tokens: _Optional[int] = ...) -> None: ...

class KvEvent(_message.Message):
    __slots__ = ("kind", "now_s", "instance_id", "keys", "tier")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[KvEvent.Kind]
        STORED: _ClassVar[KvEvent.Kind]
        EVICTED: _ClassVar[KvEvent.Kind]
        DEMOTED: _ClassVar[KvEvent.Kind]
    KIND_UNSPECIFIED: KvEvent.Kind
    STORED: KvEvent.Kind
    EVICTED: KvEvent.Kind
    DEMOTED: KvEvent.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    NOW_S_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    kind: KvEvent.Kind
    now_s: float
    instance_id: str
    keys: _containers.RepeatedScalarFieldContainer[int]
    tier: Tier
    def __init__(self, kind: _Optional[_Union[KvEvent.Kind, str]] = ..., now_s: _Optional[float] = ..., instance_id: _Optional[str] = ..., keys: _Optional[_Iterable[int]] = ..., tier: _Optional[_Union[Tier, str]] = ...) -> None: ...

class Sampling(_message.Message):
    __slots__ = ("temperature", "top_k", "seed", "ignore_eos", "logprobs", "top_logprobs")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    seed: int
    ignore_eos: bool
    logprobs: bool
    top_logprobs: int
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., ignore_eos: _Optional[bool] = ..., logprobs: _Optional[bool] = ..., top_logprobs: _Optional[int] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token", "logprob")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token: int
    logprob: float
    def __init__(self, token: _Optional[int] = ..., logprob: _Optional[float] = ...) -> None: ...

class DispatchPrefillRequest(_message.Message):
    __slots__ = ("request_id", "token_ids", "plan", "replicate", "decode_instance_id", "decode_data_address", "sampling", "return_logits", "line_position")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    REPLICATE_FIELD_NUMBER: _ClassVar[int]
    DECODE_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    DECODE_DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    RETURN_LOGITS_FIELD_NUMBER: _ClassVar[int]
    LINE_POSITION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    plan: CachePlan
    replicate: bool
    decode_instance_id: str
    decode_data_address: str
    sampling: Sampling
    return_logits: bool
    line_position: int
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., plan: _Optional[_Union[CachePlan, _Mapping]] = ..., replicate: _Optional[bool] = ..., decode_instance_id: _Optional[str] = ..., decode_data_address: _Optional[str] = ..., sampling: _Optional[_Union[Sampling, _Mapping]] = ..., return_logits: _Optional[bool] = ..., line_position: _Optional[int] = ...) -> None: ...

class PrefillTimings(_message.Message):
    __slots__ = ("queue_s", "load_s", "fetch_s", "compute_s", "load_wait_s", "store_wait_s", "store_s", "handoff_s", "total_s", "cpu_s", "ended_unix_s")
    QUEUE_S_FIELD_NUMBER: _ClassVar[int]
    LOAD_S_FIELD_NUMBER: _ClassVar[int]
    FETCH_S_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    LOAD_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    STORE_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    STORE_S_FIELD_NUMBER: _ClassVar[int]
    HANDOFF_S_FIELD_NUMBER: _ClassVar[int]
    TOTAL_S_FIELD_NUMBER: _ClassVar[int]
    CPU_S_FIELD_NUMBER: _ClassVar[int]
    ENDED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    queue_s: float
    load_s: float
    fetch_s: float
    compute_s: float
    load_wait_s: float
    store_wait_s: float
    store_s: float
    handoff_s: float
    total_s: float
    cpu_s: float
    ended_unix_s: float
    def __init__(self, queue_s: _Optional[float] = ..., load_s: _Optional[float] = ..., fetch_s: _Optional[float] = ..., compute_s: _Optional[float] = ..., load_wait_s: _Optional[float] = ..., store_wait_s: _Optional[float] = ..., store_s: _Optional[float] = ..., handoff_s: _Optional[float] = ..., total_s: _Optional[float] = ..., cpu_s: _Optional[float] = ..., ended_unix_s: _Optional[float] = ...) -> None: ...

class DispatchPrefillReply(_message.Message):
    __slots__ = ("request_id", "instance_id", "first_token", "num_tokens", "num_reused_tokens", "num_fetched_tokens", "recomputed_keys", "stored_keys", "timings", "events", "handed_off", "logits", "first_logprob", "first_top_logprobs")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_REUSED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_FETCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RECOMPUTED_KEYS_FIELD_NUMBER: _ClassVar[int]
    STORED_KEYS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    HANDED_OFF_FIELD_NUMBER: _ClassVar[int]
    LOGITS_FIELD_NUMBER: _ClassVar[int]
    FIRST_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    instance_id: str
    first_token: int
    num_tokens: int
    num_reused_tokens: int
    num_fetched_tokens: int
    recomputed_keys: _containers.RepeatedScalarFieldContainer[int]
    stored_keys: _containers.RepeatedScalarFieldContainer[int]
    timings: PrefillTimings
    events: _containers.RepeatedCompositeFieldContainer[KvEvent]
    handed_off: bool
    logits: _containers.RepeatedScalarFieldContainer[float]
    first_logprob: float
    first_top_logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, request_id: _Optional[str] = ..., instance_id: _Optional[str] = ..., first_token: _Optional[int] = ..., num_tokens: _Optional[int] = ..., num_reused_tokens: _Optional[int] = ..., num_fetched_tokens: _Optional[int] = ..., recomputed_keys: _Optional[_Iterable[int]] = ..., stored_keys: _Optional[_Iterable[int]] = ..., timings: _Optional[_Union[PrefillTimings, _Mapping]] = ..., events: _Optional[_Iterable[_Union[KvEvent, _Mapping]]] = ..., handed_off: _Optional[bool] = ..., logits: _Optional[_Iterable[float]] = ..., first_logprob: _Optional[float] = ..., first_top_logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class ArrivalCheck(_message.Message):
    __slots__ = ("tbt_slo_s", "fixed_s", "per_request_s", "per_context_token_s")
    TBT_SLO_S_FIELD_NUMBER: _ClassVar[int]
    FIXED_S_FIELD_NUMBER: _ClassVar[int]
    PER_REQUEST_S_FIELD_NUMBER: _ClassVar[int]
    PER_CONTEXT_TOKEN_S_FIELD_NUMBER: _ClassVar[int]
    tbt_slo_s: float
    fixed_s: float
    per_request_s: float
    per_context_token_s: float
    def __init__(self, tbt_slo_s: _Optional[float] = ..., fixed_s: _Optional[float] = ..., per_request_s: _Optional[float] = ..., per_context_token_s: _Optional[float] = ...) -> None: ...

class DispatchDecodeRequest(_message.Message):
    __slots__ = ("request_id", "num_context_tokens", "first_token", "max_tokens", "sampling", "arrival_check")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_CHECK_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    num_context_tokens: int
    first_token: int
    max_tokens: int
    sampling: Sampling
    arrival_check: ArrivalCheck
    def __init__(self, request_id: _Optional[str] = ..., num_context_tokens: _Optional[int] = ..., first_token: _Optional[int] = ..., max_tokens: _Optional[int] = ..., sampling: _Optional[_Union[Sampling, _Mapping]] = ..., arrival_check: _Optional[_Union[ArrivalCheck, _Mapping]] = ...) -> None: ...

class DecodeMessage(_message.Message):
    __slots__ = ("request_id", "token", "index", "done", "status", "reason", "stage", "logprob", "top_logprobs", "produced_s")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PRODUCED_S_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token: int
    index: int
    done: bool
    status: str
    reason: str
    stage: str
    logprob: float
    top_logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    produced_s: float
    def __init__(self, request_id: _Optional[str] = ..., token: _Optional[int] = ..., index: _Optional[int] = ..., done: _Optional[bool] = ..., status: _Optional[str] = ..., reason: _Optional[str] = ..., stage: _Optional[str] = ..., logprob: _Optional[float] = ..., top_logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., produced_s: _Optional[float] = ...) -> None: ...

class ReplicateBlocksRequest(_message.Message):
    __slots__ = ("request_id", "source_instance_id", "source_data_address", "keys", "first_depth")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    FIRST_DEPTH_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    source_instance_id: str
    source_data_address: str
    keys: _containers.RepeatedScalarFieldContainer[int]
    first_depth: int
    def __init__(self, request_id: _Optional[str] = ..., source_instance_id: _Optional[str] = ..., source_data_address: _Optional[str] = ..., keys: _Optional[_Iterable[int]] = ..., first_depth: _Optional[int] = ...) -> None: ...

class ReplicateBlocksReply(_message.Message):
    __slots__ = ("stored_keys", "failed_keys", "error", "events")
    STORED_KEYS_FIELD_NUMBER: _ClassVar[int]
    FAILED_KEYS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    stored_keys: _containers.RepeatedScalarFieldContainer[int]
    failed_keys: _containers.RepeatedScalarFieldContainer[int]
    error: str
    events: _containers.RepeatedCompositeFieldContainer[KvEvent]
    def __init__(self, stored_keys: _Optional[_Iterable[int]] = ..., failed_keys: _Optional[_Iterable[int]] = ..., error: _Optional[str] = ..., events: _Optional[_Iterable[_Union[KvEvent, _Mapping]]] = ...) -> None: ...

class EvictBlocksRequest(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, keys: _Optional[_Iterable[int]] = ...) -> None: ...

class EvictBlocksReply(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[KvEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[KvEvent, _Mapping]]] = ...) -> None: ...

class SetRoleRequest(_message.Message):
    __slots__ = ("role",)
    ROLE_FIELD_NUMBER: _ClassVar[int]
    role: Role
    def __init__(self, role: _Optional[_Union[Role, str]] = ...) -> None: ...

class SetRoleReply(_message.Message):
    __slots__ = ("role",)
    ROLE_FIELD_NUMBER: _ClassVar[int]
    role: Role
    def __init__(self, role: _Optional[_Union[Role, str]] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("timeout_s",)
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    timeout_s: float
    def __init__(self, timeout_s: _Optional[float] = ...) -> None: ...

class DrainReply(_message.Message):
    __slots__ = ("drained", "num_in_flight")
    DRAINED_FIELD_NUMBER: _ClassVar[int]
    NUM_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    drained: bool
    num_in_flight: int
    def __init__(self, drained: _Optional[bool] = ..., num_in_flight: _Optional[int] = ...) -> None: ...

class GetStateRequest(_message.Message):
    __slots__ = ("take_events",)
    TAKE_EVENTS_FIELD_NUMBER: _ClassVar[int]
    take_events: bool
    def __init__(self, take_events: _Optional[bool] = ...) -> None: ...

class PrefillLoad(_message.Message):
    __slots__ = ("num_queued", "num_running", "queued_tokens")
    NUM_QUEUED_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    QUEUED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    num_queued: int
    num_running: int
    queued_tokens: int
    def __init__(self, num_queued: _Optional[int] = ..., num_running: _Optional[int] = ..., queued_tokens: _Optional[int] = ...) -> None: ...

class DecodeLoad(_message.Message):
    __slots__ = ("batch_size", "context_tokens", "predicted_tbt_s", "tbt_slo_s", "last_step_s")
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_TBT_S_FIELD_NUMBER: _ClassVar[int]
    TBT_SLO_S_FIELD_NUMBER: _ClassVar[int]
    LAST_STEP_S_FIELD_NUMBER: _ClassVar[int]
    batch_size: int
    context_tokens: int
    predicted_tbt_s: float
    tbt_slo_s: float
    last_step_s: float
    def __init__(self, batch_size: _Optional[int] = ..., context_tokens: _Optional[int] = ..., predicted_tbt_s: _Optional[float] = ..., tbt_slo_s: _Optional[float] = ..., last_step_s: _Optional[float] = ...) -> None: ...

class Memory(_message.Message):
    __slots__ = ("dram_bytes", "dram_capacity_bytes", "ssd_bytes", "ssd_capacity_bytes", "num_dram_blocks", "num_ssd_blocks", "num_pinned_keys", "num_pending_handoffs")
    DRAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    DRAM_CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    SSD_BYTES_FIELD_NUMBER: _ClassVar[int]
    SSD_CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_SSD_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_PINNED_KEYS_FIELD_NUMBER: _ClassVar[int]
    NUM_PENDING_HANDOFFS_FIELD_NUMBER: _ClassVar[int]
    dram_bytes: int
    dram_capacity_bytes: int
    ssd_bytes: int
    ssd_capacity_bytes: int
    num_dram_blocks: int
    num_ssd_blocks: int
    num_pinned_keys: int
    num_pending_handoffs: int
    def __init__(self, dram_bytes: _Optional[int] = ..., dram_capacity_bytes: _Optional[int] = ..., ssd_bytes: _Optional[int] = ..., ssd_capacity_bytes: _Optional[int] = ..., num_dram_blocks: _Optional[int] = ..., num_ssd_blocks: _Optional[int] = ..., num_pinned_keys: _Optional[int] = ..., num_pending_handoffs: _Optional[int] = ...) -> None: ...

class AgentState(_message.Message):
    __slots__ = ("instance_id", "role", "control_address", "data_address", "transport", "preset", "block_size", "draining", "now_s", "prefill", "decode", "memory", "events")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTROL_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    PRESET_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    NOW_S_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    DECODE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    role: Role
    control_address: str
    data_address: str
    transport: str
    preset: str
    block_size: int
    draining: bool
    now_s: float
    prefill: PrefillLoad
    decode: DecodeLoad
    memory: Memory
    events: _containers.RepeatedCompositeFieldContainer[KvEvent]
    def __init__(self, instance_id: _Optional[str] = ..., role: _Optional[_Union[Role, str]] = ..., control_address: _Optional[str] = ..., data_address: _Optional[str] = ..., transport: _Optional[str] = ..., preset: _Optional[str] = ..., block_size: _Optional[int] = ..., draining: _Optional[bool] = ..., now_s: _Optional[float] = ..., prefill: _Optional[_Union[PrefillLoad, _Mapping]] = ..., decode: _Optional[_Union[DecodeLoad, _Mapping]] = ..., memory: _Optional[_Union[Memory, _Mapping]] = ..., events: _Optional[_Iterable[_Union[KvEvent, _Mapping]]] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("request_id", "reason")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    reason: str
    def __init__(self, request_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelReply(_message.Message):
    __slots__ = ("dropped_from",)
    DROPPED_FROM_FIELD_NUMBER: _ClassVar[int]
    dropped_from: str
    def __init__(self, dropped_from: _Optional[str] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("instance_id", "role", "control_address", "data_address", "transport", "preset", "block_size", "kv_capacity_tokens", "dram_capacity_bytes", "ssd_capacity_bytes", "now_s", "incarnation")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTROL_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    PRESET_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    KV_CAPACITY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAM_CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    SSD_CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    NOW_S_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    role: Role
    control_address: str
    data_address: str
    transport: str
    preset: str
    block_size: int
    kv_capacity_tokens: int
    dram_capacity_bytes: int
    ssd_capacity_bytes: int
    now_s: float
    incarnation: str
    def __init__(self, instance_id: _Optional[str] = ..., role: _Optional[_Union[Role, str]] = ..., control_address: _Optional[str] = ..., data_address: _Optional[str] = ..., transport: _Optional[str] = ..., preset: _Optional[str] = ..., block_size: _Optional[int] = ..., kv_capacity_tokens: _Optional[int] = ..., dram_capacity_bytes: _Optional[int] = ..., ssd_capacity_bytes: _Optional[int] = ..., now_s: _Optional[float] = ..., incarnation: _Optional[str] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("accepted", "heartbeat_interval_s", "message")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    heartbeat_interval_s: float
    message: str
    def __init__(self, accepted: _Optional[bool] = ..., heartbeat_interval_s: _Optional[float] = ..., message: _Optional[str] = ...) -> None: ...

class PrefillSample(_message.Message):
    __slots__ = ("input_tokens", "cached_tokens", "fetched_tokens", "seconds", "queue_s", "age_s", "cpu_s", "fetch_s", "handover_s")
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FETCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_S_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    CPU_S_FIELD_NUMBER: _ClassVar[int]
    FETCH_S_FIELD_NUMBER: _ClassVar[int]
    HANDOVER_S_FIELD_NUMBER: _ClassVar[int]
    input_tokens: int
    cached_tokens: int
    fetched_tokens: int
    seconds: float
    queue_s: float
    age_s: float
    cpu_s: float
    fetch_s: float
    handover_s: float
    def __init__(self, input_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., fetched_tokens: _Optional[int] = ..., seconds: _Optional[float] = ..., queue_s: _Optional[float] = ..., age_s: _Optional[float] = ..., cpu_s: _Optional[float] = ..., fetch_s: _Optional[float] = ..., handover_s: _Optional[float] = ...) -> None: ...

class DecodeStepSample(_message.Message):
    __slots__ = ("batch_size", "context_tokens", "seconds", "age_s", "cpu_s", "pause_s")
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    CPU_S_FIELD_NUMBER: _ClassVar[int]
    PAUSE_S_FIELD_NUMBER: _ClassVar[int]
    batch_size: int
    context_tokens: int
    seconds: float
    age_s: float
    cpu_s: float
    pause_s: float
    def __init__(self, batch_size: _Optional[int] = ..., context_tokens: _Optional[int] = ..., seconds: _Optional[float] = ..., age_s: _Optional[float] = ..., cpu_s: _Optional[float] = ..., pause_s: _Optional[float] = ...) -> None: ...

class HostCpuSample(_message.Message):
    __slots__ = ("host_id", "cpus", "busy_s", "total_s")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    BUSY_S_FIELD_NUMBER: _ClassVar[int]
    TOTAL_S_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    cpus: int
    busy_s: float
    total_s: float
    def __init__(self, host_id: _Optional[str] = ..., cpus: _Optional[int] = ..., busy_s: _Optional[float] = ..., total_s: _Optional[float] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("instance_id", "sequence", "now_s", "role", "draining", "prefill", "decode", "memory", "events", "first_event_index", "num_dropped_events", "final", "prefill_samples", "decode_steps", "host_cpu")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    NOW_S_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    DECODE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    FIRST_EVENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_DROPPED_EVENTS_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    PREFILL_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DECODE_STEPS_FIELD_NUMBER: _ClassVar[int]
    HOST_CPU_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    sequence: int
    now_s: float
    role: Role
    draining: bool
    prefill: PrefillLoad
    decode: DecodeLoad
    memory: Memory
    events: _containers.RepeatedCompositeFieldContainer[KvEvent]
    first_event_index: int
    num_dropped_events: int
    final: bool
    prefill_samples: _containers.RepeatedCompositeFieldContainer[PrefillSample]
    decode_steps: _containers.RepeatedCompositeFieldContainer[DecodeStepSample]
    host_cpu: HostCpuSample
    def __init__(self, instance_id: _Optional[str] = ..., sequence: _Optional[int] = ..., now_s: _Optional[float] = ..., role: _Optional[_Union[Role, str]] = ..., draining: _Optional[bool] = ..., prefill: _Optional[_Union[PrefillLoad, _Mapping]] = ..., decode: _Optional[_Union[DecodeLoad, _Mapping]] = ..., memory: _Optional[_Union[Memory, _Mapping]] = ..., events: _Optional[_Iterable[_Union[KvEvent, _Mapping]]] = ..., first_event_index: _Optional[int] = ..., num_dropped_events: _Optional[int] = ..., final: _Optional[bool] = ..., prefill_samples: _Optional[_Iterable[_Union[PrefillSample, _Mapping]]] = ..., decode_steps: _Optional[_Iterable[_Union[DecodeStepSample, _Mapping]]] = ..., host_cpu: _Optional[_Union[HostCpuSample, _Mapping]] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("acknowledged", "rejoin", "message")
    ACKNOWLEDGED_FIELD_NUMBER: _ClassVar[int]
    REJOIN_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    acknowledged: bool
    rejoin: bool
    message: str
    def __init__(self, acknowledged: _Optional[bool] = ..., rejoin: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...
