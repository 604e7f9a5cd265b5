"""The analysis service's domain object: job table and job creation (no gRPC here)."""

from __future__ import annotations

from trace_common.errors import Unimplemented
from trace_common.jobs import JobManager, JobRecord

from .metrics import M
from .settings import AnalysisSettings
from .specs import AnalysisSpecModel


class Analyses:
    def __init__(self, settings: AnalysisSettings):
        self.settings = settings
        self.jobs = JobManager("analysis", M, max_concurrent=settings.max_concurrent_jobs)

    def create_job(self, spec: AnalysisSpecModel, run_id: str, labels: dict[str, str],
                   request_id: str) -> JobRecord:
        self.jobs.validate_request(run_id, labels, request_id)
        raise Unimplemented(
            f"analysis jobs are not implemented yet (mode {spec.mode}): discovery/labeling prompts, "
            "contrastive statistics and reports arrive with the analysis issue")
