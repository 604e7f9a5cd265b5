"""The trainer service's domain object: job table and job creation (no gRPC here)."""

from __future__ import annotations

from trace_common.errors import Unimplemented
from trace_common.jobs import JobManager, JobRecord

from .metrics import M
from .settings import TrainerSettings
from .specs import TrainingSpecModel


class Training:
    def __init__(self, settings: TrainerSettings):
        self.settings = settings
        self.jobs = JobManager("trainer", M, max_concurrent=settings.max_concurrent_jobs)
        self.checkpoints: dict[str, list] = {}

    def create_job(self, spec: TrainingSpecModel, run_id: str, labels: dict[str, str],
                   request_id: str) -> JobRecord:
        self.jobs.validate_request(run_id, labels, request_id)
        what = "GRPO adapter training" if spec.kind == "TRAINING_KIND_ADAPTER" else "MoE gate training"
        raise Unimplemented(f"{what} is not implemented yet (capability {spec.capability!r}): it arrives with "
                            f"the {'trainer' if spec.kind == 'TRAINING_KIND_ADAPTER' else 'MoE composition'} issue")

    def list_checkpoints(self, job_id: str) -> list:
        self.jobs.get(job_id)
        return self.checkpoints.get(job_id, [])
