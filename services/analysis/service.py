"""The analysis service's domain object: job table and job creation (no gRPC here).

A job runs `job.run_analysis`; its record's `result` is the `AnalysisResult` (the servicer
turns it into GetAnalysisJob's `results` and `mode`), and its outputs are the report files.
`spec.llm` (when given, in either mode) is checked against the operator's endpoint profiles
(`endpoints`, from TRACE_ANALYSIS_ENDPOINTS) at creation: a credential, URL or model the operator
did not allow is PERMISSION_DENIED before a job exists, and nothing is sent. `spec.rollout_uris` is
checked at creation too (artifacts_io.confine_rollouts): the request's own run's rollouts in this
service's store (`store`), or the operator's store prefixes (TRACE_ANALYSIS_ROLLOUT_ROOTS); any other
URI is PERMISSION_DENIED before a job exists, and the job reads only what was admitted.
"""

from __future__ import annotations

from trace_common.artifacts import open_store
from trace_common.endpoints import Endpoints
from trace_common.errors import InvalidArgument
from trace_common.jobs import JobContext, JobManager, JobRecord, estimate_footprint

from .artifacts_io import confine_rollouts
from .job import analyst_config, run_analysis
from .metrics import M
from .result import AnalysisResult
from .settings import AnalysisSettings
from .specs import AnalysisSpecModel

JOB_KIND = "analysis"


class Analyses:
    def __init__(self, settings: AnalysisSettings):
        self.settings = settings
        self.jobs = JobManager.from_settings("analysis", M, settings)
        #: The operator's endpoint profiles (the embedded stack's operator may add more in-process).
        self.endpoints = Endpoints(settings.endpoints, "TRACE_ANALYSIS_ENDPOINTS")
        #: This service's store: a job writes its report there and reads its own run's rollouts from it.
        self.store = open_store(settings.artifact_root, settings.s3_settings(), M.artifact_observer)
        #: Store prefixes a job may read rollouts from besides its own run's (TRACE_ANALYSIS_ROLLOUT_ROOTS;
        #: the embedded stack's operator may add more in-process).
        self.rollout_roots = list(settings.rollout_roots)

    def create_job(self, spec: AnalysisSpecModel, run_id: str, labels: dict[str, str],
                   request_id: str) -> JobRecord:
        self.jobs.validate_request(run_id, labels, request_id)
        endpoint = self.endpoints.llm(spec.llm, "spec.llm") if spec.llm is not None else None
        analyst = (analyst_config(spec, self.settings, endpoint)
                   if endpoint is not None and spec.mode == "ANALYST_MODE_LLM" else None)
        rollouts = confine_rollouts(spec.rollout_uris, run_id, self.store, self.rollout_roots,
                                    self.settings.s3_settings(), M.artifact_observer)
        first: dict[str, int] = {}
        for i, ref in enumerate(rollouts):  # two spellings of one artifact (a path and its file:// URI, %-escapes)
            if first.setdefault(ref.uri, i) != i:
                raise InvalidArgument(field=f"spec.rollout_uris[{i}]", expected="each artifact once",
                                      got=f"the artifact of spec.rollout_uris[{first[ref.uri]}] again",
                                      fix="list each rollout artifact once (its trajectories would count twice)")

        async def body(ctx: JobContext) -> AnalysisResult:
            return await run_analysis(ctx, spec, self.settings, analyst, rollouts=rollouts)

        return self.jobs.submit(JOB_KIND, body, run_id=run_id, labels=labels, request_id=request_id,
                                footprint=estimate_footprint(spec))

    def result(self, rec: JobRecord) -> AnalysisResult | None:
        """The finished analysis of a SUCCEEDED job, else None."""
        return rec.result if isinstance(rec.result, AnalysisResult) else None
