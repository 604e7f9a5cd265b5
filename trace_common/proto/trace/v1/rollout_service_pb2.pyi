from trace.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union
DESCRIPTOR: _descriptor.FileDescriptor

class TaskSelection(_message.Message):
    __slots__ = ('split', 'task_ids', 'limit')
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    split: str
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    limit: int

    def __init__(self, split: _Optional[str]=..., task_ids: _Optional[_Iterable[str]]=..., limit: _Optional[int]=...) -> None:
        ...

class RolloutSpec(_message.Message):
    __slots__ = ('environment', 'policy', 'tasks', 'samples_per_task', 'sampling', 'concurrency', 'max_turns', 'seed', 'user_simulator', 'output_uri', 'system_prompt')
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_TASK_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    MAX_TURNS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    USER_SIMULATOR_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_URI_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    environment: _types_pb2.EnvironmentRef
    policy: _types_pb2.PolicyRef
    tasks: TaskSelection
    samples_per_task: int
    sampling: _types_pb2.SamplingParams
    concurrency: int
    max_turns: int
    seed: int
    user_simulator: _types_pb2.LlmEndpoint
    output_uri: str
    system_prompt: str

    def __init__(self, environment: _Optional[_Union[_types_pb2.EnvironmentRef, _Mapping]]=..., policy: _Optional[_Union[_types_pb2.PolicyRef, _Mapping]]=..., tasks: _Optional[_Union[TaskSelection, _Mapping]]=..., samples_per_task: _Optional[int]=..., sampling: _Optional[_Union[_types_pb2.SamplingParams, _Mapping]]=..., concurrency: _Optional[int]=..., max_turns: _Optional[int]=..., seed: _Optional[int]=..., user_simulator: _Optional[_Union[_types_pb2.LlmEndpoint, _Mapping]]=..., output_uri: _Optional[str]=..., system_prompt: _Optional[str]=...) -> None:
        ...

class CreateRolloutJobRequest(_message.Message):
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
    spec: RolloutSpec
    run_id: str
    labels: _containers.ScalarMap[str, str]
    request_id: str

    def __init__(self, spec: _Optional[_Union[RolloutSpec, _Mapping]]=..., run_id: _Optional[str]=..., labels: _Optional[_Mapping[str, str]]=..., request_id: _Optional[str]=...) -> None:
        ...

class CreateRolloutJobResponse(_message.Message):
    __slots__ = ('job',)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job

    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]]=...) -> None:
        ...

class GetRolloutJobRequest(_message.Message):
    __slots__ = ('job_id',)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str

    def __init__(self, job_id: _Optional[str]=...) -> None:
        ...

class GetRolloutJobResponse(_message.Message):
    __slots__ = ('job', 'summary')
    JOB_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job
    summary: RolloutSummary

    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]]=..., summary: _Optional[_Union[RolloutSummary, _Mapping]]=...) -> None:
        ...

class RolloutSummary(_message.Message):
    __slots__ = ('episodes', 'successes', 'pass_rate', 'pass_rate_ci_low', 'pass_rate_ci_high', 'reward_mean', 'errored_episodes', 'terminations')

    class TerminationsEntry(_message.Message):
        __slots__ = ('key', 'value')
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int

        def __init__(self, key: _Optional[str]=..., value: _Optional[int]=...) -> None:
            ...
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    SUCCESSES_FIELD_NUMBER: _ClassVar[int]
    PASS_RATE_FIELD_NUMBER: _ClassVar[int]
    PASS_RATE_CI_LOW_FIELD_NUMBER: _ClassVar[int]
    PASS_RATE_CI_HIGH_FIELD_NUMBER: _ClassVar[int]
    REWARD_MEAN_FIELD_NUMBER: _ClassVar[int]
    ERRORED_EPISODES_FIELD_NUMBER: _ClassVar[int]
    TERMINATIONS_FIELD_NUMBER: _ClassVar[int]
    episodes: int
    successes: int
    pass_rate: float
    pass_rate_ci_low: float
    pass_rate_ci_high: float
    reward_mean: float
    errored_episodes: int
    terminations: _containers.ScalarMap[str, int]

    def __init__(self, episodes: _Optional[int]=..., successes: _Optional[int]=..., pass_rate: _Optional[float]=..., pass_rate_ci_low: _Optional[float]=..., pass_rate_ci_high: _Optional[float]=..., reward_mean: _Optional[float]=..., errored_episodes: _Optional[int]=..., terminations: _Optional[_Mapping[str, int]]=...) -> None:
        ...

class WatchRolloutJobRequest(_message.Message):
    __slots__ = ('job_id',)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str

    def __init__(self, job_id: _Optional[str]=...) -> None:
        ...

class WatchRolloutJobResponse(_message.Message):
    __slots__ = ('job',)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job

    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]]=...) -> None:
        ...

class ListRolloutJobsRequest(_message.Message):
    __slots__ = ('filter', 'page_size', 'page_token')
    FILTER_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    filter: _types_pb2.JobFilter
    page_size: int
    page_token: str

    def __init__(self, filter: _Optional[_Union[_types_pb2.JobFilter, _Mapping]]=..., page_size: _Optional[int]=..., page_token: _Optional[str]=...) -> None:
        ...

class ListRolloutJobsResponse(_message.Message):
    __slots__ = ('jobs', 'next_page_token')
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[_types_pb2.Job]
    next_page_token: str

    def __init__(self, jobs: _Optional[_Iterable[_Union[_types_pb2.Job, _Mapping]]]=..., next_page_token: _Optional[str]=...) -> None:
        ...

class CancelRolloutJobRequest(_message.Message):
    __slots__ = ('job_id',)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str

    def __init__(self, job_id: _Optional[str]=...) -> None:
        ...

class CancelRolloutJobResponse(_message.Message):
    __slots__ = ('job',)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job

    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]]=...) -> None:
        ...

class ListRolloutEnvironmentsRequest(_message.Message):
    __slots__ = ()

    def __init__(self) -> None:
        ...

class EnvironmentInfo(_message.Message):
    __slots__ = ('name', 'version', 'description', 'split_sizes', 'tools')

    class SplitSizesEntry(_message.Message):
        __slots__ = ('key', 'value')
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int

        def __init__(self, key: _Optional[str]=..., value: _Optional[int]=...) -> None:
            ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    SPLIT_SIZES_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    description: str
    split_sizes: _containers.ScalarMap[str, int]
    tools: _containers.RepeatedCompositeFieldContainer[_types_pb2.ToolSchema]

    def __init__(self, name: _Optional[str]=..., version: _Optional[str]=..., description: _Optional[str]=..., split_sizes: _Optional[_Mapping[str, int]]=..., tools: _Optional[_Iterable[_Union[_types_pb2.ToolSchema, _Mapping]]]=...) -> None:
        ...

class ListRolloutEnvironmentsResponse(_message.Message):
    __slots__ = ('environments',)
    ENVIRONMENTS_FIELD_NUMBER: _ClassVar[int]
    environments: _containers.RepeatedCompositeFieldContainer[EnvironmentInfo]

    def __init__(self, environments: _Optional[_Iterable[_Union[EnvironmentInfo, _Mapping]]]=...) -> None:
        ...