"""The rollout service's domain object: job table and job creation (no gRPC here)."""

from __future__ import annotations

from trace_common.errors import Unimplemented
from trace_common.jobs import JobManager, JobRecord

from .metrics import M
from .settings import RolloutSettings
from .specs import RolloutSpecModel


class Rollouts:
    def __init__(self, settings: RolloutSettings):
        self.settings = settings
        self.jobs = JobManager("rollout", M, max_concurrent=settings.max_concurrent_jobs)

    def create_job(self, spec: RolloutSpecModel, run_id: str, labels: dict[str, str],
                   request_id: str) -> JobRecord:
        self.jobs.validate_request(run_id, labels, request_id)
        raise Unimplemented(
            f"rollout jobs are not implemented yet (requested environment {spec.environment.name!r}): the "
            "environment SDK, the built-in domain and the policy backends arrive with the rollout issue")

    def environments(self) -> list[dict]:
        return []
