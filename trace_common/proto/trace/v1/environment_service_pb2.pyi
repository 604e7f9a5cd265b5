from trace.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union
DESCRIPTOR: _descriptor.FileDescriptor

class GenerationMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GENERATION_MODE_UNSPECIFIED: _ClassVar[GenerationMode]
    GENERATION_MODE_LIBRARY: _ClassVar[GenerationMode]
    GENERATION_MODE_LLM: _ClassVar[GenerationMode]

class ValidationStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VALIDATION_STATUS_UNSPECIFIED: _ClassVar[ValidationStatus]
    VALIDATION_STATUS_ACCEPTED: _ClassVar[ValidationStatus]
    VALIDATION_STATUS_REJECTED: _ClassVar[ValidationStatus]
GENERATION_MODE_UNSPECIFIED: GenerationMode
GENERATION_MODE_LIBRARY: GenerationMode
GENERATION_MODE_LLM: GenerationMode
VALIDATION_STATUS_UNSPECIFIED: ValidationStatus
VALIDATION_STATUS_ACCEPTED: ValidationStatus
VALIDATION_STATUS_REJECTED: ValidationStatus

class GenerationSpec(_message.Message):
    __slots__ = ('capabilities', 'target', 'mode', 'llm', 'max_retries', 'calibration_policy', 'calibration_reward_min', 'calibration_reward_max', 'seed', 'calibration_min_informative', 'calibration_sampling')
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    LLM_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_POLICY_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_REWARD_MIN_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_REWARD_MAX_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_MIN_INFORMATIVE_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_SAMPLING_FIELD_NUMBER: _ClassVar[int]
    capabilities: _containers.RepeatedCompositeFieldContainer[_types_pb2.Capability]
    target: _types_pb2.EnvironmentRef
    mode: GenerationMode
    llm: _types_pb2.LlmEndpoint
    max_retries: int
    calibration_policy: _types_pb2.PolicyRef
    calibration_reward_min: float
    calibration_reward_max: float
    seed: int
    calibration_min_informative: float
    calibration_sampling: _types_pb2.SamplingParams

    def __init__(self, capabilities: _Optional[_Iterable[_Union[_types_pb2.Capability, _Mapping]]]=..., target: _Optional[_Union[_types_pb2.EnvironmentRef, _Mapping]]=..., mode: _Optional[_Union[GenerationMode, str]]=..., llm: _Optional[_Union[_types_pb2.LlmEndpoint, _Mapping]]=..., max_retries: _Optional[int]=..., calibration_policy: _Optional[_Union[_types_pb2.PolicyRef, _Mapping]]=..., calibration_reward_min: _Optional[float]=..., calibration_reward_max: _Optional[float]=..., seed: _Optional[int]=..., calibration_min_informative: _Optional[float]=..., calibration_sampling: _Optional[_Union[_types_pb2.SamplingParams, _Mapping]]=...) -> None:
        ...

class CreateGenerationJobRequest(_message.Message):
    __slots__ = ('spec', 'run_id', 'labels', 'request_id')

    class LabelsEntry(_message.Message):
        __slots__ = ('key', 'value')
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str

        def __init__(self, key: _Optional[str]=..., value: _Optional[str]=...) -> None:
            ...
    SPEC_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    spec: GenerationSpec
    run_id: str
    labels: _containers.ScalarMap[str, str]
    request_id: str

    def __init__(self, spec: _Optional[_Union[GenerationSpec, _Mapping]]=..., run_id: _Optional[str]=..., labels: _Optional[_Mapping[str, str]]=..., request_id: _Optional[str]=...) -> None:
        ...

class CreateGenerationJobResponse(_message.Message):
    __slots__ = ('job',)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job

    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]]=...) -> None:
        ...

class GetGenerationJobRequest(_message.Message):
    __slots__ = ('job_id',)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str

    def __init__(self, job_id: _Optional[str]=...) -> None:
        ...

class GetGenerationJobResponse(_message.Message):
    __slots__ = ('job', 'environments')
    JOB_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENTS_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job
    environments: _containers.RepeatedCompositeFieldContainer[EnvironmentRecord]

    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]]=..., environments: _Optional[_Iterable[_Union[EnvironmentRecord, _Mapping]]]=...) -> None:
        ...

class EnvironmentRecord(_message.Message):
    __slots__ = ('name', 'version', 'capability', 'mode', 'status', 'code', 'validation_report', 'rejection_reasons', 'calibration_reward_mean', 'calibration_informative_fraction')
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    VALIDATION_REPORT_FIELD_NUMBER: _ClassVar[int]
    REJECTION_REASONS_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_REWARD_MEAN_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_INFORMATIVE_FRACTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    capability: str
    mode: GenerationMode
    status: ValidationStatus
    code: _types_pb2.ArtifactRef
    validation_report: _types_pb2.ArtifactRef
    rejection_reasons: _containers.RepeatedScalarFieldContainer[str]
    calibration_reward_mean: float
    calibration_informative_fraction: float

    def __init__(self, name: _Optional[str]=..., version: _Optional[str]=..., capability: _Optional[str]=..., mode: _Optional[_Union[GenerationMode, str]]=..., status: _Optional[_Union[ValidationStatus, str]]=..., code: _Optional[_Union[_types_pb2.ArtifactRef, _Mapping]]=..., validation_report: _Optional[_Union[_types_pb2.ArtifactRef, _Mapping]]=..., rejection_reasons: _Optional[_Iterable[str]]=..., calibration_reward_mean: _Optional[float]=..., calibration_informative_fraction: _Optional[float]=...) -> None:
        ...

class WatchGenerationJobRequest(_message.Message):
    __slots__ = ('job_id',)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str

    def __init__(self, job_id: _Optional[str]=...) -> None:
        ...

class WatchGenerationJobResponse(_message.Message):
    __slots__ = ('job',)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job

    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]]=...) -> None:
        ...

class ListGenerationJobsRequest(_message.Message):
    __slots__ = ('filter', 'page_size', 'page_token')
    FILTER_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    filter: _types_pb2.JobFilter
    page_size: int
    page_token: str

    def __init__(self, filter: _Optional[_Union[_types_pb2.JobFilter, _Mapping]]=..., page_size: _Optional[int]=..., page_token: _Optional[str]=...) -> None:
        ...

class ListGenerationJobsResponse(_message.Message):
    __slots__ = ('jobs', 'next_page_token')
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[_types_pb2.Job]
    next_page_token: str

    def __init__(self, jobs: _Optional[_Iterable[_Union[_types_pb2.Job, _Mapping]]]=..., next_page_token: _Optional[str]=...) -> None:
        ...

class CancelGenerationJobRequest(_message.Message):
    __slots__ = ('job_id',)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str

    def __init__(self, job_id: _Optional[str]=...) -> None:
        ...

class CancelGenerationJobResponse(_message.Message):
    __slots__ = ('job',)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job

    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]]=...) -> None:
        ...

class ListEnvironmentsRequest(_message.Message):
    __slots__ = ('capability', 'include_rejected')
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_REJECTED_FIELD_NUMBER: _ClassVar[int]
    capability: str
    include_rejected: bool

    def __init__(self, capability: _Optional[str]=..., include_rejected: _Optional[bool]=...) -> None:
        ...

class ListEnvironmentsResponse(_message.Message):
    __slots__ = ('environments',)
    ENVIRONMENTS_FIELD_NUMBER: _ClassVar[int]
    environments: _containers.RepeatedCompositeFieldContainer[EnvironmentRecord]

    def __init__(self, environments: _Optional[_Iterable[_Union[EnvironmentRecord, _Mapping]]]=...) -> None:
        ...

class GetEnvironmentRequest(_message.Message):
    __slots__ = ('name', 'version')
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str

    def __init__(self, name: _Optional[str]=..., version: _Optional[str]=...) -> None:
        ...

class GetEnvironmentResponse(_message.Message):
    __slots__ = ('environment', 'tools')
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    environment: EnvironmentRecord
    tools: _containers.RepeatedCompositeFieldContainer[_types_pb2.ToolSchema]

    def __init__(self, environment: _Optional[_Union[EnvironmentRecord, _Mapping]]=..., tools: _Optional[_Iterable[_Union[_types_pb2.ToolSchema, _Mapping]]]=...) -> None:
        ...

class ResetEpisodeRequest(_message.Message):
    __slots__ = ('environment', 'seed')
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    environment: _types_pb2.EnvironmentRef
    seed: int

    def __init__(self, environment: _Optional[_Union[_types_pb2.EnvironmentRef, _Mapping]]=..., seed: _Optional[int]=...) -> None:
        ...

class ResetEpisodeResponse(_message.Message):
    __slots__ = ('episode_id', 'messages', 'tools', 'guidance')
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    GUIDANCE_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    messages: _containers.RepeatedCompositeFieldContainer[_types_pb2.ChatMessage]
    tools: _containers.RepeatedCompositeFieldContainer[_types_pb2.ToolSchema]
    guidance: str

    def __init__(self, episode_id: _Optional[str]=..., messages: _Optional[_Iterable[_Union[_types_pb2.ChatMessage, _Mapping]]]=..., tools: _Optional[_Iterable[_Union[_types_pb2.ToolSchema, _Mapping]]]=..., guidance: _Optional[str]=...) -> None:
        ...

class StepEpisodeRequest(_message.Message):
    __slots__ = ('episode_id', 'tool_call', 'message')
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    tool_call: _types_pb2.ToolCall
    message: str

    def __init__(self, episode_id: _Optional[str]=..., tool_call: _Optional[_Union[_types_pb2.ToolCall, _Mapping]]=..., message: _Optional[str]=...) -> None:
        ...

class StepEpisodeResponse(_message.Message):
    __slots__ = ('observation', 'done', 'reward', 'diagnostics_json')
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    DIAGNOSTICS_JSON_FIELD_NUMBER: _ClassVar[int]
    observation: _types_pb2.ChatMessage
    done: bool
    reward: float
    diagnostics_json: _containers.RepeatedScalarFieldContainer[str]

    def __init__(self, observation: _Optional[_Union[_types_pb2.ChatMessage, _Mapping]]=..., done: _Optional[bool]=..., reward: _Optional[float]=..., diagnostics_json: _Optional[_Iterable[str]]=...) -> None:
        ...

class CloseEpisodeRequest(_message.Message):
    __slots__ = ('episode_id',)
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    episode_id: str

    def __init__(self, episode_id: _Optional[str]=...) -> None:
        ...

class CloseEpisodeResponse(_message.Message):
    __slots__ = ()

    def __init__(self) -> None:
        ...