"""Create a job on a service, follow it with a progress bar, return the final Get response."""

from __future__ import annotations

from dataclasses import dataclass

from trace_common.grpc.client import messages, new_request_id
from trace_common.proto.trace.v1 import types_pb2 as t
from tracectl.progress import follow

#: service -> (Create, Watch, Get) method name stems
_NAMES = {"rollout": "RolloutJob", "analysis": "AnalysisJob", "environment": "GenerationJob",
          "trainer": "TrainingJob"}


class StageFailed(Exception):
    """A stage's job did not succeed; the message carries the service's reason."""


@dataclass
class JobRunner:
    conn: object  # tracectl.connect.Connection

    def start(self, service: str, spec, run_id: str, labels: dict[str, str] | None = None,
              request_id: str | None = None):
        pb = messages(service)
        stem = _NAMES[service]
        req = getattr(pb, f"Create{stem}Request")(spec=spec, run_id=run_id, labels=labels or {},
                                                  request_id=request_id or new_request_id())
        return getattr(self.conn.stub(service), f"Create{stem}")(req).job

    def wait(self, service: str, job_id: str, description: str):
        pb = messages(service)
        stem = _NAMES[service]
        stub = self.conn.stub(service)
        follow(getattr(stub, f"Watch{stem}")(getattr(pb, f"Watch{stem}Request")(job_id=job_id)), description)
        resp = getattr(stub, f"Get{stem}")(getattr(pb, f"Get{stem}Request")(job_id=job_id))
        if resp.job.state != t.JOB_STATE_SUCCEEDED:
            state = t.JobState.Name(resp.job.state).removeprefix("JOB_STATE_")
            raise StageFailed(f"{service} job {job_id} {state}: {resp.job.error.code} {resp.job.error.message}")
        return resp

    def run(self, service: str, spec, run_id: str, description: str, **kw):
        job = self.start(service, spec, run_id, **kw)
        return self.wait(service, job.job_id, description)
