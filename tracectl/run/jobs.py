"""Create a job on a service, follow it with a progress bar, return the final Get response.

`run(..., attach=True)` first looks for a live job of the same run with the same labels and the
same spec (a `spec_sha` label, the spec's digest) and follows that one instead of creating
another: a `tracectl run` re-run while its old training job still runs on a deployed trainer
re-attaches to it (the trainer refuses a second job on the same checkpoints).
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass

from trace_common.grpc.client import messages, new_request_id
from trace_common.proto.trace.v1 import types_pb2 as t
from tracectl.progress import follow

#: service -> (Create, Watch, Get) method name stems
_NAMES = {"rollout": "RolloutJob", "analysis": "AnalysisJob", "environment": "GenerationJob",
          "trainer": "TrainingJob"}


class StageFailed(Exception):
    """A stage's job did not succeed; the message carries the service's reason."""


class JobFailed(StageFailed):
    """A job that ended without succeeding: its id, its state and the service's error code (a gRPC
    status name, e.g. FAILED_PRECONDITION), for a stage that treats one kind of failure as a result."""

    def __init__(self, message: str, *, job_id: str, code: str):
        super().__init__(message)
        self.job_id, self.code = job_id, code


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
        follow(lambda: getattr(stub, f"Watch{stem}")(getattr(pb, f"Watch{stem}Request")(job_id=job_id)),
               description)
        resp = getattr(stub, f"Get{stem}")(getattr(pb, f"Get{stem}Request")(job_id=job_id))
        if resp.job.state != t.JOB_STATE_SUCCEEDED:
            state = t.JobState.Name(resp.job.state).removeprefix("JOB_STATE_")
            raise JobFailed(f"{service} job {job_id} {state}: {resp.job.error.code} {resp.job.error.message}",
                            job_id=job_id, code=str(resp.job.error.code))
        return resp

    def find_live(self, service: str, run_id: str, labels: dict[str, str]) -> str | None:
        """Id of a pending or running job of `run_id` carrying all of `labels`, if any."""
        pb = messages(service)
        stem = _NAMES[service]
        stub = self.conn.stub(service)
        token = ""
        while True:
            resp = getattr(stub, f"List{stem}s")(getattr(pb, f"List{stem}sRequest")(
                filter=t.JobFilter(run_id=run_id, states=[t.JOB_STATE_PENDING, t.JOB_STATE_RUNNING]),
                page_size=100, page_token=token))
            for job in resp.jobs:
                if all(job.labels.get(k) == v for k, v in labels.items()):
                    return job.job_id
            token = resp.next_page_token
            if not token:
                return None

    def run(self, service: str, spec, run_id: str, description: str, *, attach: bool = False,
            labels: dict[str, str] | None = None, **kw):
        labels = dict(labels or {})
        if attach:
            labels["spec_sha"] = spec_digest(spec)
            live = self.find_live(service, run_id, labels)
            if live is not None:
                print(f"{description}: re-attaching to live {service} job {live} (same run and spec)", file=sys.stderr,
                      flush=True)
                return self.wait(service, live, description)
        job = self.start(service, spec, run_id, labels=labels, **kw)
        return self.wait(service, job.job_id, description)


def spec_digest(spec) -> str:
    """16 hex digits of sha256 over the spec's deterministic protobuf encoding."""
    return hashlib.sha256(spec.SerializeToString(deterministic=True)).hexdigest()[:16]
