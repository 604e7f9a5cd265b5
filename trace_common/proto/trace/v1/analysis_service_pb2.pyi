from trace.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union
DESCRIPTOR: _descriptor.FileDescriptor

class AnalystMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ANALYST_MODE_UNSPECIFIED: _ClassVar[AnalystMode]
    ANALYST_MODE_LLM: _ClassVar[AnalystMode]
    ANALYST_MODE_DIAGNOSTICS: _ClassVar[AnalystMode]
ANALYST_MODE_UNSPECIFIED: AnalystMode
ANALYST_MODE_LLM: AnalystMode
ANALYST_MODE_DIAGNOSTICS: AnalystMode

class AnalysisSpec(_message.Message):
    __slots__ = ('rollout_uris', 'mode', 'llm', 'num_runs', 'min_passing_runs', 'min_coverage', 'min_gap', 'max_candidates', 'seed', 'trajectory_char_budget')
    ROLLOUT_URIS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    LLM_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNS_FIELD_NUMBER: _ClassVar[int]
    MIN_PASSING_RUNS_FIELD_NUMBER: _ClassVar[int]
    MIN_COVERAGE_FIELD_NUMBER: _ClassVar[int]
    MIN_GAP_FIELD_NUMBER: _ClassVar[int]
    MAX_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_CHAR_BUDGET_FIELD_NUMBER: _ClassVar[int]
    rollout_uris: _containers.RepeatedScalarFieldContainer[str]
    mode: AnalystMode
    llm: _types_pb2.LlmEndpoint
    num_runs: int
    min_passing_runs: int
    min_coverage: float
    min_gap: float
    max_candidates: int
    seed: int
    trajectory_char_budget: int

    def __init__(self, rollout_uris: _Optional[_Iterable[str]]=..., mode: _Optional[_Union[AnalystMode, str]]=..., llm: _Optional[_Union[_types_pb2.LlmEndpoint, _Mapping]]=..., num_runs: _Optional[int]=..., min_passing_runs: _Optional[int]=..., min_coverage: _Optional[float]=..., min_gap: _Optional[float]=..., max_candidates: _Optional[int]=..., seed: _Optional[int]=..., trajectory_char_budget: _Optional[int]=...) -> None:
        ...

class CreateAnalysisJobRequest(_message.Message):
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
    spec: AnalysisSpec
    run_id: str
    labels: _containers.ScalarMap[str, str]
    request_id: str

    def __init__(self, spec: _Optional[_Union[AnalysisSpec, _Mapping]]=..., run_id: _Optional[str]=..., labels: _Optional[_Mapping[str, str]]=..., request_id: _Optional[str]=...) -> None:
        ...

class CreateAnalysisJobResponse(_message.Message):
    __slots__ = ('job',)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job

    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]]=...) -> None:
        ...

class GetAnalysisJobRequest(_message.Message):
    __slots__ = ('job_id',)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str

    def __init__(self, job_id: _Optional[str]=...) -> None:
        ...

class CapabilityResult(_message.Message):
    __slots__ = ('capability', 'retained', 'passing_runs', 'coverage_mean', 'coverage_std', 'gap_mean', 'gap_std', 'rejection_reason')
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    RETAINED_FIELD_NUMBER: _ClassVar[int]
    PASSING_RUNS_FIELD_NUMBER: _ClassVar[int]
    COVERAGE_MEAN_FIELD_NUMBER: _ClassVar[int]
    COVERAGE_STD_FIELD_NUMBER: _ClassVar[int]
    GAP_MEAN_FIELD_NUMBER: _ClassVar[int]
    GAP_STD_FIELD_NUMBER: _ClassVar[int]
    REJECTION_REASON_FIELD_NUMBER: _ClassVar[int]
    capability: _types_pb2.Capability
    retained: bool
    passing_runs: int
    coverage_mean: float
    coverage_std: float
    gap_mean: float
    gap_std: float
    rejection_reason: str

    def __init__(self, capability: _Optional[_Union[_types_pb2.Capability, _Mapping]]=..., retained: _Optional[bool]=..., passing_runs: _Optional[int]=..., coverage_mean: _Optional[float]=..., coverage_std: _Optional[float]=..., gap_mean: _Optional[float]=..., gap_std: _Optional[float]=..., rejection_reason: _Optional[str]=...) -> None:
        ...

class GetAnalysisJobResponse(_message.Message):
    __slots__ = ('job', 'results', 'mode', 'unexplained_failures')
    JOB_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    UNEXPLAINED_FAILURES_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job
    results: _containers.RepeatedCompositeFieldContainer[CapabilityResult]
    mode: AnalystMode
    unexplained_failures: UnexplainedFailures

    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]]=..., results: _Optional[_Iterable[_Union[CapabilityResult, _Mapping]]]=..., mode: _Optional[_Union[AnalystMode, str]]=..., unexplained_failures: _Optional[_Union[UnexplainedFailures, _Mapping]]=...) -> None:
        ...

class UnexplainedFailures(_message.Message):
    __slots__ = ('failed', 'by_retained', 'by_candidates')
    FAILED_FIELD_NUMBER: _ClassVar[int]
    BY_RETAINED_FIELD_NUMBER: _ClassVar[int]
    BY_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    failed: int
    by_retained: int
    by_candidates: int

    def __init__(self, failed: _Optional[int]=..., by_retained: _Optional[int]=..., by_candidates: _Optional[int]=...) -> None:
        ...

class WatchAnalysisJobRequest(_message.Message):
    __slots__ = ('job_id',)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str

    def __init__(self, job_id: _Optional[str]=...) -> None:
        ...

class WatchAnalysisJobResponse(_message.Message):
    __slots__ = ('job',)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job

    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]]=...) -> None:
        ...

class ListAnalysisJobsRequest(_message.Message):
    __slots__ = ('filter', 'page_size', 'page_token')
    FILTER_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    filter: _types_pb2.JobFilter
    page_size: int
    page_token: str

    def __init__(self, filter: _Optional[_Union[_types_pb2.JobFilter, _Mapping]]=..., page_size: _Optional[int]=..., page_token: _Optional[str]=...) -> None:
        ...

class ListAnalysisJobsResponse(_message.Message):
    __slots__ = ('jobs', 'next_page_token')
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[_types_pb2.Job]
    next_page_token: str

    def __init__(self, jobs: _Optional[_Iterable[_Union[_types_pb2.Job, _Mapping]]]=..., next_page_token: _Optional[str]=...) -> None:
        ...

class CancelAnalysisJobRequest(_message.Message):
    __slots__ = ('job_id',)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str

    def __init__(self, job_id: _Optional[str]=...) -> None:
        ...

class CancelAnalysisJobResponse(_message.Message):
    __slots__ = ('job',)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job

    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]]=...) -> None:
        ...