from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PlanState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PLAN_STATE_UNSPECIFIED: _ClassVar[PlanState]
    PLAN_STATE_RECEIVED: _ClassVar[PlanState]
    PLAN_STATE_APPLIED: _ClassVar[PlanState]
    PLAN_STATE_FAILED: _ClassVar[PlanState]
PLAN_STATE_UNSPECIFIED: PlanState
PLAN_STATE_RECEIVED: PlanState
PLAN_STATE_APPLIED: PlanState
PLAN_STATE_FAILED: PlanState

class NDArray(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class DeviceInfo(_message.Message):
    __slots__ = ("device_id", "index", "kind", "model", "memory_total_bytes", "rank")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    index: int
    kind: str
    model: str
    memory_total_bytes: int
    rank: int
    def __init__(self, device_id: _Optional[str] = ..., index: _Optional[int] = ..., kind: _Optional[str] = ..., model: _Optional[str] = ..., memory_total_bytes: _Optional[int] = ..., rank: _Optional[int] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("node_id", "hostname", "agent_version", "devices", "job_id", "ranks", "job")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    hostname: str
    agent_version: str
    devices: _containers.RepeatedCompositeFieldContainer[DeviceInfo]
    job_id: str
    ranks: _containers.RepeatedScalarFieldContainer[int]
    job: JobSpec
    def __init__(self, node_id: _Optional[str] = ..., hostname: _Optional[str] = ..., agent_version: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[DeviceInfo, _Mapping]]] = ..., job_id: _Optional[str] = ..., ranks: _Optional[_Iterable[int]] = ..., job: _Optional[_Union[JobSpec, _Mapping]] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("job_id", "layers", "experts", "top_k", "world_size", "slots_per_rank", "ranks_per_node", "groups")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    EXPERTS_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    SLOTS_PER_RANK_FIELD_NUMBER: _ClassVar[int]
    RANKS_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    layers: int
    experts: int
    top_k: int
    world_size: int
    slots_per_rank: int
    ranks_per_node: int
    groups: int
    def __init__(self, job_id: _Optional[str] = ..., layers: _Optional[int] = ..., experts: _Optional[int] = ..., top_k: _Optional[int] = ..., world_size: _Optional[int] = ..., slots_per_rank: _Optional[int] = ..., ranks_per_node: _Optional[int] = ..., groups: _Optional[int] = ...) -> None: ...

class DeviceSamples(_message.Message):
    __slots__ = ("timestamp", "device_ids", "metrics", "values")
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    DEVICE_IDS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    timestamp: float
    device_ids: _containers.RepeatedScalarFieldContainer[str]
    metrics: _containers.RepeatedScalarFieldContainer[str]
    values: NDArray
    def __init__(self, timestamp: _Optional[float] = ..., device_ids: _Optional[_Iterable[str]] = ..., metrics: _Optional[_Iterable[str]] = ..., values: _Optional[_Union[NDArray, _Mapping]] = ...) -> None: ...

class ExpertLoads(_message.Message):
    __slots__ = ("job_id", "step", "ranks", "missing_ranks", "counts", "timestamp")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    MISSING_RANKS_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    step: int
    ranks: _containers.RepeatedScalarFieldContainer[int]
    missing_ranks: _containers.RepeatedScalarFieldContainer[int]
    counts: NDArray
    timestamp: float
    def __init__(self, job_id: _Optional[str] = ..., step: _Optional[int] = ..., ranks: _Optional[_Iterable[int]] = ..., missing_ranks: _Optional[_Iterable[int]] = ..., counts: _Optional[_Union[NDArray, _Mapping]] = ..., timestamp: _Optional[float] = ...) -> None: ...

class RankStepStats(_message.Message):
    __slots__ = ("rank", "step_time_s", "host_bound_ratio", "tokens")
    RANK_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    HOST_BOUND_RATIO_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    rank: int
    step_time_s: float
    host_bound_ratio: float
    tokens: int
    def __init__(self, rank: _Optional[int] = ..., step_time_s: _Optional[float] = ..., host_bound_ratio: _Optional[float] = ..., tokens: _Optional[int] = ...) -> None: ...

class StepStats(_message.Message):
    __slots__ = ("job_id", "step", "timestamp", "ranks")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    step: int
    timestamp: float
    ranks: _containers.RepeatedCompositeFieldContainer[RankStepStats]
    def __init__(self, job_id: _Optional[str] = ..., step: _Optional[int] = ..., timestamp: _Optional[float] = ..., ranks: _Optional[_Iterable[_Union[RankStepStats, _Mapping]]] = ...) -> None: ...

class PlanReport(_message.Message):
    __slots__ = ("job_id", "epoch", "state", "step", "error")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    epoch: int
    state: PlanState
    step: int
    error: str
    def __init__(self, job_id: _Optional[str] = ..., epoch: _Optional[int] = ..., state: _Optional[_Union[PlanState, str]] = ..., step: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class LayerMemory(_message.Message):
    __slots__ = ("name", "activation_bytes", "forward_s", "backward_s", "parameter_bytes", "optimizer_bytes", "input_bytes", "gradient_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ACTIVATION_BYTES_FIELD_NUMBER: _ClassVar[int]
    FORWARD_S_FIELD_NUMBER: _ClassVar[int]
    BACKWARD_S_FIELD_NUMBER: _ClassVar[int]
    PARAMETER_BYTES_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_BYTES_FIELD_NUMBER: _ClassVar[int]
    INPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    activation_bytes: int
    forward_s: float
    backward_s: float
    parameter_bytes: int
    optimizer_bytes: int
    input_bytes: int
    gradient_bytes: int
    def __init__(self, name: _Optional[str] = ..., activation_bytes: _Optional[int] = ..., forward_s: _Optional[float] = ..., backward_s: _Optional[float] = ..., parameter_bytes: _Optional[int] = ..., optimizer_bytes: _Optional[int] = ..., input_bytes: _Optional[int] = ..., gradient_bytes: _Optional[int] = ...) -> None: ...

class MemoryProfile(_message.Message):
    __slots__ = ("device_id", "rank", "capacity_bytes", "used_bytes", "parameters_bytes", "gradients_bytes", "optimizer_bytes", "activations_peak_bytes", "layers", "host_link_bytes_per_s", "applied_actions", "micro_batch_size")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_BYTES_FIELD_NUMBER: _ClassVar[int]
    GRADIENTS_BYTES_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_BYTES_FIELD_NUMBER: _ClassVar[int]
    ACTIVATIONS_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    HOST_LINK_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    APPLIED_ACTIONS_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    rank: int
    capacity_bytes: int
    used_bytes: int
    parameters_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_peak_bytes: int
    layers: _containers.RepeatedCompositeFieldContainer[LayerMemory]
    host_link_bytes_per_s: float
    applied_actions: _containers.RepeatedScalarFieldContainer[str]
    micro_batch_size: int
    def __init__(self, device_id: _Optional[str] = ..., rank: _Optional[int] = ..., capacity_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., parameters_bytes: _Optional[int] = ..., gradients_bytes: _Optional[int] = ..., optimizer_bytes: _Optional[int] = ..., activations_peak_bytes: _Optional[int] = ..., layers: _Optional[_Iterable[_Union[LayerMemory, _Mapping]]] = ..., host_link_bytes_per_s: _Optional[float] = ..., applied_actions: _Optional[_Iterable[str]] = ..., micro_batch_size: _Optional[int] = ...) -> None: ...

class MemoryProfiles(_message.Message):
    __slots__ = ("job_id", "step", "timestamp", "host_free_bytes", "devices")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    HOST_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    step: int
    timestamp: float
    host_free_bytes: int
    devices: _containers.RepeatedCompositeFieldContainer[MemoryProfile]
    def __init__(self, job_id: _Optional[str] = ..., step: _Optional[int] = ..., timestamp: _Optional[float] = ..., host_free_bytes: _Optional[int] = ..., devices: _Optional[_Iterable[_Union[MemoryProfile, _Mapping]]] = ...) -> None: ...

class OffloadReport(_message.Message):
    __slots__ = ("job_id", "decision_id", "device_id", "state", "step", "measured_used_bytes", "measured_saved_bytes", "error")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    MEASURED_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEASURED_SAVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    decision_id: int
    device_id: str
    state: PlanState
    step: int
    measured_used_bytes: int
    measured_saved_bytes: int
    error: str
    def __init__(self, job_id: _Optional[str] = ..., decision_id: _Optional[int] = ..., device_id: _Optional[str] = ..., state: _Optional[_Union[PlanState, str]] = ..., step: _Optional[int] = ..., measured_used_bytes: _Optional[int] = ..., measured_saved_bytes: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class AgentMessage(_message.Message):
    __slots__ = ("seq", "hello", "samples", "loads", "step_stats", "plan_report", "memory", "offload_report", "rl")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    LOADS_FIELD_NUMBER: _ClassVar[int]
    STEP_STATS_FIELD_NUMBER: _ClassVar[int]
    PLAN_REPORT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    OFFLOAD_REPORT_FIELD_NUMBER: _ClassVar[int]
    RL_FIELD_NUMBER: _ClassVar[int]
    seq: int
    hello: Hello
    samples: DeviceSamples
    loads: ExpertLoads
    step_stats: StepStats
    plan_report: PlanReport
    memory: MemoryProfiles
    offload_report: OffloadReport
    rl: RLReport
    def __init__(self, seq: _Optional[int] = ..., hello: _Optional[_Union[Hello, _Mapping]] = ..., samples: _Optional[_Union[DeviceSamples, _Mapping]] = ..., loads: _Optional[_Union[ExpertLoads, _Mapping]] = ..., step_stats: _Optional[_Union[StepStats, _Mapping]] = ..., plan_report: _Optional[_Union[PlanReport, _Mapping]] = ..., memory: _Optional[_Union[MemoryProfiles, _Mapping]] = ..., offload_report: _Optional[_Union[OffloadReport, _Mapping]] = ..., rl: _Optional[_Union[RLReport, _Mapping]] = ...) -> None: ...

class RLSpans(_message.Message):
    __slots__ = ("phase_names", "role_names", "step", "rank", "version", "phase", "role", "start", "end", "tokens")
    PHASE_NAMES_FIELD_NUMBER: _ClassVar[int]
    ROLE_NAMES_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    phase_names: _containers.RepeatedScalarFieldContainer[str]
    role_names: _containers.RepeatedScalarFieldContainer[str]
    step: NDArray
    rank: NDArray
    version: NDArray
    phase: NDArray
    role: NDArray
    start: NDArray
    end: NDArray
    tokens: NDArray
    def __init__(self, phase_names: _Optional[_Iterable[str]] = ..., role_names: _Optional[_Iterable[str]] = ..., step: _Optional[_Union[NDArray, _Mapping]] = ..., rank: _Optional[_Union[NDArray, _Mapping]] = ..., version: _Optional[_Union[NDArray, _Mapping]] = ..., phase: _Optional[_Union[NDArray, _Mapping]] = ..., role: _Optional[_Union[NDArray, _Mapping]] = ..., start: _Optional[_Union[NDArray, _Mapping]] = ..., end: _Optional[_Union[NDArray, _Mapping]] = ..., tokens: _Optional[_Union[NDArray, _Mapping]] = ...) -> None: ...

class WeightSync(_message.Message):
    __slots__ = ("step", "rank", "from_version", "to_version", "bytes", "start", "pause_s", "transfer_s", "resume_s")
    STEP_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    FROM_VERSION_FIELD_NUMBER: _ClassVar[int]
    TO_VERSION_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    PAUSE_S_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_S_FIELD_NUMBER: _ClassVar[int]
    RESUME_S_FIELD_NUMBER: _ClassVar[int]
    step: int
    rank: int
    from_version: int
    to_version: int
    bytes: int
    start: float
    pause_s: float
    transfer_s: float
    resume_s: float
    def __init__(self, step: _Optional[int] = ..., rank: _Optional[int] = ..., from_version: _Optional[int] = ..., to_version: _Optional[int] = ..., bytes: _Optional[int] = ..., start: _Optional[float] = ..., pause_s: _Optional[float] = ..., transfer_s: _Optional[float] = ..., resume_s: _Optional[float] = ...) -> None: ...

class ConsumedBatch(_message.Message):
    __slots__ = ("step", "rank", "trained_version", "samples", "lag_min", "lag_mean", "lag_max", "bound", "dropped", "partial", "timestamp")
    STEP_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    TRAINED_VERSION_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    LAG_MIN_FIELD_NUMBER: _ClassVar[int]
    LAG_MEAN_FIELD_NUMBER: _ClassVar[int]
    LAG_MAX_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    step: int
    rank: int
    trained_version: int
    samples: int
    lag_min: int
    lag_mean: float
    lag_max: int
    bound: int
    dropped: int
    partial: int
    timestamp: float
    def __init__(self, step: _Optional[int] = ..., rank: _Optional[int] = ..., trained_version: _Optional[int] = ..., samples: _Optional[int] = ..., lag_min: _Optional[int] = ..., lag_mean: _Optional[float] = ..., lag_max: _Optional[int] = ..., bound: _Optional[int] = ..., dropped: _Optional[int] = ..., partial: _Optional[int] = ..., timestamp: _Optional[float] = ...) -> None: ...

class PhaseLoads(_message.Message):
    __slots__ = ("step", "rank", "phase", "counts", "timestamp")
    STEP_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    step: int
    rank: int
    phase: str
    counts: NDArray
    timestamp: float
    def __init__(self, step: _Optional[int] = ..., rank: _Optional[int] = ..., phase: _Optional[str] = ..., counts: _Optional[_Union[NDArray, _Mapping]] = ..., timestamp: _Optional[float] = ...) -> None: ...

class RLReport(_message.Message):
    __slots__ = ("job_id", "spans", "syncs", "batches", "phase_loads")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    SYNCS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    PHASE_LOADS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    spans: RLSpans
    syncs: _containers.RepeatedCompositeFieldContainer[WeightSync]
    batches: _containers.RepeatedCompositeFieldContainer[ConsumedBatch]
    phase_loads: _containers.RepeatedCompositeFieldContainer[PhaseLoads]
    def __init__(self, job_id: _Optional[str] = ..., spans: _Optional[_Union[RLSpans, _Mapping]] = ..., syncs: _Optional[_Iterable[_Union[WeightSync, _Mapping]]] = ..., batches: _Optional[_Iterable[_Union[ConsumedBatch, _Mapping]]] = ..., phase_loads: _Optional[_Iterable[_Union[PhaseLoads, _Mapping]]] = ...) -> None: ...

class Config(_message.Message):
    __slots__ = ("sample_interval_s", "job_id", "resume_after_seq")
    SAMPLE_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RESUME_AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    sample_interval_s: float
    job_id: str
    resume_after_seq: int
    def __init__(self, sample_interval_s: _Optional[float] = ..., job_id: _Optional[str] = ..., resume_after_seq: _Optional[int] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("seq", "code", "message", "duplicate")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    code: int
    message: str
    duplicate: bool
    def __init__(self, seq: _Optional[int] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class PlacementPlan(_message.Message):
    __slots__ = ("job_id", "epoch", "phy2log", "slots_per_rank", "not_before_step", "base_epoch", "changed_slots", "changed_experts")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PHY2LOG_FIELD_NUMBER: _ClassVar[int]
    SLOTS_PER_RANK_FIELD_NUMBER: _ClassVar[int]
    NOT_BEFORE_STEP_FIELD_NUMBER: _ClassVar[int]
    BASE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    CHANGED_SLOTS_FIELD_NUMBER: _ClassVar[int]
    CHANGED_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    epoch: int
    phy2log: NDArray
    slots_per_rank: int
    not_before_step: int
    base_epoch: int
    changed_slots: NDArray
    changed_experts: NDArray
    def __init__(self, job_id: _Optional[str] = ..., epoch: _Optional[int] = ..., phy2log: _Optional[_Union[NDArray, _Mapping]] = ..., slots_per_rank: _Optional[int] = ..., not_before_step: _Optional[int] = ..., base_epoch: _Optional[int] = ..., changed_slots: _Optional[_Union[NDArray, _Mapping]] = ..., changed_experts: _Optional[_Union[NDArray, _Mapping]] = ...) -> None: ...

class OffloadAction(_message.Message):
    __slots__ = ("kind", "layers", "bytes_saved", "host_bytes", "overhead_s")
    KIND_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    BYTES_SAVED_FIELD_NUMBER: _ClassVar[int]
    HOST_BYTES_FIELD_NUMBER: _ClassVar[int]
    OVERHEAD_S_FIELD_NUMBER: _ClassVar[int]
    kind: str
    layers: _containers.RepeatedScalarFieldContainer[str]
    bytes_saved: int
    host_bytes: int
    overhead_s: float
    def __init__(self, kind: _Optional[str] = ..., layers: _Optional[_Iterable[str]] = ..., bytes_saved: _Optional[int] = ..., host_bytes: _Optional[int] = ..., overhead_s: _Optional[float] = ...) -> None: ...

class OffloadDecision(_message.Message):
    __slots__ = ("job_id", "decision_id", "device_id", "rank", "verdict", "actions", "reason", "predicted_peak_bytes")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    decision_id: int
    device_id: str
    rank: int
    verdict: str
    actions: _containers.RepeatedCompositeFieldContainer[OffloadAction]
    reason: str
    predicted_peak_bytes: int
    def __init__(self, job_id: _Optional[str] = ..., decision_id: _Optional[int] = ..., device_id: _Optional[str] = ..., rank: _Optional[int] = ..., verdict: _Optional[str] = ..., actions: _Optional[_Iterable[_Union[OffloadAction, _Mapping]]] = ..., reason: _Optional[str] = ..., predicted_peak_bytes: _Optional[int] = ...) -> None: ...

class ControlMessage(_message.Message):
    __slots__ = ("config", "ack", "plan", "offload")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    OFFLOAD_FIELD_NUMBER: _ClassVar[int]
    config: Config
    ack: Ack
    plan: PlacementPlan
    offload: OffloadDecision
    def __init__(self, config: _Optional[_Union[Config, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., plan: _Optional[_Union[PlacementPlan, _Mapping]] = ..., offload: _Optional[_Union[OffloadDecision, _Mapping]] = ...) -> None: ...

class RankHello(_message.Message):
    __slots__ = ("job", "rank", "device_id")
    JOB_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    job: JobSpec
    rank: int
    device_id: str
    def __init__(self, job: _Optional[_Union[JobSpec, _Mapping]] = ..., rank: _Optional[int] = ..., device_id: _Optional[str] = ...) -> None: ...

class RankStep(_message.Message):
    __slots__ = ("step", "counts", "stats", "timestamp", "memory")
    STEP_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    step: int
    counts: NDArray
    stats: RankStepStats
    timestamp: float
    memory: MemoryProfile
    def __init__(self, step: _Optional[int] = ..., counts: _Optional[_Union[NDArray, _Mapping]] = ..., stats: _Optional[_Union[RankStepStats, _Mapping]] = ..., timestamp: _Optional[float] = ..., memory: _Optional[_Union[MemoryProfile, _Mapping]] = ...) -> None: ...

class RankMessage(_message.Message):
    __slots__ = ("hello", "step", "plan_report", "offload_report", "rl")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    PLAN_REPORT_FIELD_NUMBER: _ClassVar[int]
    OFFLOAD_REPORT_FIELD_NUMBER: _ClassVar[int]
    RL_FIELD_NUMBER: _ClassVar[int]
    hello: RankHello
    step: RankStep
    plan_report: PlanReport
    offload_report: OffloadReport
    rl: RLReport
    def __init__(self, hello: _Optional[_Union[RankHello, _Mapping]] = ..., step: _Optional[_Union[RankStep, _Mapping]] = ..., plan_report: _Optional[_Union[PlanReport, _Mapping]] = ..., offload_report: _Optional[_Union[OffloadReport, _Mapping]] = ..., rl: _Optional[_Union[RLReport, _Mapping]] = ...) -> None: ...

class RankControl(_message.Message):
    __slots__ = ("plan", "ack", "offload")
    PLAN_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    OFFLOAD_FIELD_NUMBER: _ClassVar[int]
    plan: PlacementPlan
    ack: Ack
    offload: OffloadDecision
    def __init__(self, plan: _Optional[_Union[PlacementPlan, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., offload: _Optional[_Union[OffloadDecision, _Mapping]] = ...) -> None: ...
