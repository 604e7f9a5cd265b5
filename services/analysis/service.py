"""The analysis service's domain object: job table and job creation (no gRPC here).

A job runs `pipeline.run_analysis`; its record's `result` is the `AnalysisResult` (the servicer
turns it into GetAnalysisJob's `results` and `mode`), and its outputs are the report files.
"""

from __future__ import annotations

from trace_common.jobs import JobContext, JobManager, JobRecord

from .metrics import M
from .pipeline import run_analysis
from .result import AnalysisResult
from .settings import AnalysisSettings
from .specs import AnalysisSpecModel

JOB_KIND = "analysis"


class Analyses:
    def __init__(self, settings: AnalysisSettings):
        self.settings = settings
        self.jobs = JobManager("analysis", M, max_concurrent=settings.max_concurrent_jobs)

    def create_job(self, spec: AnalysisSpecModel, run_id: str, labels: dict[str, str],
                   request_id: str) -> JobRecord:
        self.jobs.validate_request(run_id, labels, request_id)

        async def body(ctx: JobContext) -> AnalysisResult:
            return await run_analysis(ctx, spec, self.settings)

        return self.jobs.submit(JOB_KIND, body, run_id=run_id, labels=labels, request_id=request_id)

    def result(self, rec: JobRecord) -> AnalysisResult | None:
        """The finished analysis of a SUCCEEDED job, else None."""
        return rec.result if isinstance(rec.result, AnalysisResult) else None
