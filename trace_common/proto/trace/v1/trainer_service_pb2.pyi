from trace.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union
DESCRIPTOR: _descriptor.FileDescriptor

class TrainingKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRAINING_KIND_UNSPECIFIED: _ClassVar[TrainingKind]
    TRAINING_KIND_ADAPTER: _ClassVar[TrainingKind]
    TRAINING_KIND_GATES: _ClassVar[TrainingKind]

class Executor(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXECUTOR_UNSPECIFIED: _ClassVar[Executor]
    EXECUTOR_LOCAL: _ClassVar[Executor]
    EXECUTOR_KUBERNETES: _ClassVar[Executor]
TRAINING_KIND_UNSPECIFIED: TrainingKind
TRAINING_KIND_ADAPTER: TrainingKind
TRAINING_KIND_GATES: TrainingKind
EXECUTOR_UNSPECIFIED: Executor
EXECUTOR_LOCAL: Executor
EXECUTOR_KUBERNETES: Executor

class TrainingSpec(_message.Message):
    __slots__ = ('kind', 'capability', 'environments', 'policy', 'adapter_uris', 'config', 'executor', 'resume_from_uri')

    class AdapterUrisEntry(_message.Message):
        __slots__ = ('key', 'value')
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str

        def __init__(self, key: _Optional[str]=..., value: _Optional[str]=...) -> None:
            ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENTS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_URIS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_FIELD_NUMBER: _ClassVar[int]
    RESUME_FROM_URI_FIELD_NUMBER: _ClassVar[int]
    kind: TrainingKind
    capability: str
    environments: _containers.RepeatedCompositeFieldContainer[_types_pb2.EnvironmentRef]
    policy: _types_pb2.PolicyRef
    adapter_uris: _containers.ScalarMap[str, str]
    config: _types_pb2.Config
    executor: Executor
    resume_from_uri: str

    def __init__(self, kind: _Optional[_Union[TrainingKind, str]]=..., capability: _Optional[str]=..., environments: _Optional[_Iterable[_Union[_types_pb2.EnvironmentRef, _Mapping]]]=..., policy: _Optional[_Union[_types_pb2.PolicyRef, _Mapping]]=..., adapter_uris: _Optional[_Mapping[str, str]]=..., config: _Optional[_Union[_types_pb2.Config, _Mapping]]=..., executor: _Optional[_Union[Executor, str]]=..., resume_from_uri: _Optional[str]=...) -> None:
        ...

class CreateTrainingJobRequest(_message.Message):
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
    spec: TrainingSpec
    run_id: str
    labels: _containers.ScalarMap[str, str]
    request_id: str

    def __init__(self, spec: _Optional[_Union[TrainingSpec, _Mapping]]=..., run_id: _Optional[str]=..., labels: _Optional[_Mapping[str, str]]=..., request_id: _Optional[str]=...) -> None:
        ...

class CreateTrainingJobResponse(_message.Message):
    __slots__ = ('job',)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job

    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]]=...) -> None:
        ...

class GetTrainingJobRequest(_message.Message):
    __slots__ = ('job_id',)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str

    def __init__(self, job_id: _Optional[str]=...) -> None:
        ...

class IterationMetrics(_message.Message):
    __slots__ = ('iteration', 'values')

    class ValuesEntry(_message.Message):
        __slots__ = ('key', 'value')
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float

        def __init__(self, key: _Optional[str]=..., value: _Optional[float]=...) -> None:
            ...
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    iteration: int
    values: _containers.ScalarMap[str, float]

    def __init__(self, iteration: _Optional[int]=..., values: _Optional[_Mapping[str, float]]=...) -> None:
        ...

class GetTrainingJobResponse(_message.Message):
    __slots__ = ('job', 'recent_iterations')
    JOB_FIELD_NUMBER: _ClassVar[int]
    RECENT_ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job
    recent_iterations: _containers.RepeatedCompositeFieldContainer[IterationMetrics]

    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]]=..., recent_iterations: _Optional[_Iterable[_Union[IterationMetrics, _Mapping]]]=...) -> None:
        ...

class WatchTrainingJobRequest(_message.Message):
    __slots__ = ('job_id',)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str

    def __init__(self, job_id: _Optional[str]=...) -> None:
        ...

class WatchTrainingJobResponse(_message.Message):
    __slots__ = ('job', 'iteration')
    JOB_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job
    iteration: IterationMetrics

    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]]=..., iteration: _Optional[_Union[IterationMetrics, _Mapping]]=...) -> None:
        ...

class ListTrainingJobsRequest(_message.Message):
    __slots__ = ('filter', 'page_size', 'page_token')
    FILTER_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    filter: _types_pb2.JobFilter
    page_size: int
    page_token: str

    def __init__(self, filter: _Optional[_Union[_types_pb2.JobFilter, _Mapping]]=..., page_size: _Optional[int]=..., page_token: _Optional[str]=...) -> None:
        ...

class ListTrainingJobsResponse(_message.Message):
    __slots__ = ('jobs', 'next_page_token')
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[_types_pb2.Job]
    next_page_token: str

    def __init__(self, jobs: _Optional[_Iterable[_Union[_types_pb2.Job, _Mapping]]]=..., next_page_token: _Optional[str]=...) -> None:
        ...

class CancelTrainingJobRequest(_message.Message):
    __slots__ = ('job_id',)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str

    def __init__(self, job_id: _Optional[str]=...) -> None:
        ...

class CancelTrainingJobResponse(_message.Message):
    __slots__ = ('job',)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job

    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]]=...) -> None:
        ...

class ListCheckpointsRequest(_message.Message):
    __slots__ = ('job_id',)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str

    def __init__(self, job_id: _Optional[str]=...) -> None:
        ...

class Checkpoint(_message.Message):
    __slots__ = ('iteration', 'artifact')
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    iteration: int
    artifact: _types_pb2.ArtifactRef

    def __init__(self, iteration: _Optional[int]=..., artifact: _Optional[_Union[_types_pb2.ArtifactRef, _Mapping]]=...) -> None:
        ...

class ListCheckpointsResponse(_message.Message):
    __slots__ = ('checkpoints',)
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    checkpoints: _containers.RepeatedCompositeFieldContainer[Checkpoint]

    def __init__(self, checkpoints: _Optional[_Iterable[_Union[Checkpoint, _Mapping]]]=...) -> None:
        ...

class ValidateTrainingConfigRequest(_message.Message):
    __slots__ = ('kind', 'config', 'field_path', 'executor')
    KIND_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    FIELD_PATH_FIELD_NUMBER: _ClassVar[int]
    EXECUTOR_FIELD_NUMBER: _ClassVar[int]
    kind: TrainingKind
    config: _types_pb2.Config
    field_path: str
    executor: Executor

    def __init__(self, kind: _Optional[_Union[TrainingKind, str]]=..., config: _Optional[_Union[_types_pb2.Config, _Mapping]]=..., field_path: _Optional[str]=..., executor: _Optional[_Union[Executor, str]]=...) -> None:
        ...

class ValidateTrainingConfigResponse(_message.Message):
    __slots__ = ('config',)
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    config: _types_pb2.Config

    def __init__(self, config: _Optional[_Union[_types_pb2.Config, _Mapping]]=...) -> None:
        ...