import datetime
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union
DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_PENDING: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_SUCCEEDED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
    JOB_STATE_CANCELLED: _ClassVar[JobState]

class PolicyBackend(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POLICY_BACKEND_UNSPECIFIED: _ClassVar[PolicyBackend]
    POLICY_BACKEND_IN_PROCESS: _ClassVar[PolicyBackend]
    POLICY_BACKEND_OPENAI_HTTP: _ClassVar[PolicyBackend]
    POLICY_BACKEND_SCRIPTED: _ClassVar[PolicyBackend]
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_PENDING: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_SUCCEEDED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_CANCELLED: JobState
POLICY_BACKEND_UNSPECIFIED: PolicyBackend
POLICY_BACKEND_IN_PROCESS: PolicyBackend
POLICY_BACKEND_OPENAI_HTTP: PolicyBackend
POLICY_BACKEND_SCRIPTED: PolicyBackend

class Progress(_message.Message):
    __slots__ = ('completed', 'total', 'stage', 'message')
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    completed: int
    total: int
    stage: str
    message: str

    def __init__(self, completed: _Optional[int]=..., total: _Optional[int]=..., stage: _Optional[str]=..., message: _Optional[str]=...) -> None:
        ...

class ArtifactRef(_message.Message):
    __slots__ = ('uri', 'sha256', 'size_bytes', 'kind')
    URI_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    uri: str
    sha256: str
    size_bytes: int
    kind: str

    def __init__(self, uri: _Optional[str]=..., sha256: _Optional[str]=..., size_bytes: _Optional[int]=..., kind: _Optional[str]=...) -> None:
        ...

class JobError(_message.Message):
    __slots__ = ('code', 'message')
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str

    def __init__(self, code: _Optional[str]=..., message: _Optional[str]=...) -> None:
        ...

class Job(_message.Message):
    __slots__ = ('job_id', 'kind', 'state', 'progress', 'create_time', 'start_time', 'end_time', 'outputs', 'error', 'run_id', 'labels', 'metrics')

    class LabelsEntry(_message.Message):
        __slots__ = ('key', 'value')
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str

        def __init__(self, key: _Optional[str]=..., value: _Optional[str]=...) -> None:
            ...

    class MetricsEntry(_message.Message):
        __slots__ = ('key', 'value')
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float

        def __init__(self, key: _Optional[str]=..., value: _Optional[float]=...) -> None:
            ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    kind: str
    state: JobState
    progress: Progress
    create_time: _timestamp_pb2.Timestamp
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    outputs: _containers.RepeatedCompositeFieldContainer[ArtifactRef]
    error: JobError
    run_id: str
    labels: _containers.ScalarMap[str, str]
    metrics: _containers.ScalarMap[str, float]

    def __init__(self, job_id: _Optional[str]=..., kind: _Optional[str]=..., state: _Optional[_Union[JobState, str]]=..., progress: _Optional[_Union[Progress, _Mapping]]=..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]]=..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]]=..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]]=..., outputs: _Optional[_Iterable[_Union[ArtifactRef, _Mapping]]]=..., error: _Optional[_Union[JobError, _Mapping]]=..., run_id: _Optional[str]=..., labels: _Optional[_Mapping[str, str]]=..., metrics: _Optional[_Mapping[str, float]]=...) -> None:
        ...

class JobFilter(_message.Message):
    __slots__ = ('states', 'run_id')
    STATES_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[JobState]
    run_id: str

    def __init__(self, states: _Optional[_Iterable[_Union[JobState, str]]]=..., run_id: _Optional[str]=...) -> None:
        ...

class EnvironmentRef(_message.Message):
    __slots__ = ('name', 'version', 'uri', 'params')

    class ParamsEntry(_message.Message):
        __slots__ = ('key', 'value')
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str

        def __init__(self, key: _Optional[str]=..., value: _Optional[str]=...) -> None:
            ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    uri: str
    params: _containers.ScalarMap[str, str]

    def __init__(self, name: _Optional[str]=..., version: _Optional[str]=..., uri: _Optional[str]=..., params: _Optional[_Mapping[str, str]]=...) -> None:
        ...

class PolicyRef(_message.Message):
    __slots__ = ('backend', 'model', 'adapter_uri', 'adapter_name', 'endpoint', 'composition_uri', 'routing', 'endpoint_profile')
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_URI_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    COMPOSITION_URI_FIELD_NUMBER: _ClassVar[int]
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_PROFILE_FIELD_NUMBER: _ClassVar[int]
    backend: PolicyBackend
    model: str
    adapter_uri: str
    adapter_name: str
    endpoint: str
    composition_uri: str
    routing: str
    endpoint_profile: str

    def __init__(self, backend: _Optional[_Union[PolicyBackend, str]]=..., model: _Optional[str]=..., adapter_uri: _Optional[str]=..., adapter_name: _Optional[str]=..., endpoint: _Optional[str]=..., composition_uri: _Optional[str]=..., routing: _Optional[str]=..., endpoint_profile: _Optional[str]=...) -> None:
        ...

class SamplingParams(_message.Message):
    __slots__ = ('temperature', 'top_p', 'top_k', 'max_tokens', 'seed')
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    seed: int

    def __init__(self, temperature: _Optional[float]=..., top_p: _Optional[float]=..., top_k: _Optional[int]=..., max_tokens: _Optional[int]=..., seed: _Optional[int]=...) -> None:
        ...

class LlmEndpoint(_message.Message):
    __slots__ = ('base_url', 'model', 'api_key_env', 'timeout_seconds', 'max_concurrency', 'profile')
    BASE_URL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    API_KEY_ENV_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    base_url: str
    model: str
    api_key_env: str
    timeout_seconds: float
    max_concurrency: int
    profile: str

    def __init__(self, base_url: _Optional[str]=..., model: _Optional[str]=..., api_key_env: _Optional[str]=..., timeout_seconds: _Optional[float]=..., max_concurrency: _Optional[int]=..., profile: _Optional[str]=...) -> None:
        ...

class ToolCall(_message.Message):
    __slots__ = ('id', 'name', 'arguments_json')
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments_json: str

    def __init__(self, id: _Optional[str]=..., name: _Optional[str]=..., arguments_json: _Optional[str]=...) -> None:
        ...

class ChatMessage(_message.Message):
    __slots__ = ('role', 'content', 'tool_calls', 'tool_call_id', 'name')
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    tool_call_id: str
    name: str

    def __init__(self, role: _Optional[str]=..., content: _Optional[str]=..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]]=..., tool_call_id: _Optional[str]=..., name: _Optional[str]=...) -> None:
        ...

class ToolSchema(_message.Message):
    __slots__ = ('json',)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str

    def __init__(self, json: _Optional[str]=...) -> None:
        ...

class Capability(_message.Message):
    __slots__ = ('name', 'description', 'evidence', 'failed_task_ids')
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    FAILED_TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    evidence: _containers.RepeatedScalarFieldContainer[str]
    failed_task_ids: _containers.RepeatedScalarFieldContainer[str]

    def __init__(self, name: _Optional[str]=..., description: _Optional[str]=..., evidence: _Optional[_Iterable[str]]=..., failed_task_ids: _Optional[_Iterable[str]]=...) -> None:
        ...

class Config(_message.Message):
    __slots__ = ('values',)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _struct_pb2.Struct

    def __init__(self, values: _Optional[_Union[_struct_pb2.Struct, _Mapping]]=...) -> None:
        ...