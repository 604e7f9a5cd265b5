"""Proto <-> domain translation of jobs, shared by the five servicers' Get/List/Watch/Cancel.

Each servicer's job RPCs are one line that calls these with its own response class.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from google.protobuf.timestamp_pb2 import Timestamp

from trace_common.jobs import JobManager, JobRecord, JobState
from trace_common.proto.trace.v1 import types_pb2


def _ts(t: float | None) -> Timestamp | None:
    if t is None:
        return None
    ts = Timestamp()
    ts.FromNanoseconds(int(t * 1e9))
    return ts


def job_to_proto(rec: JobRecord) -> types_pb2.Job:
    job = types_pb2.Job(
        job_id=rec.job_id, kind=rec.kind, state=int(rec.state), run_id=rec.run_id,
        progress=types_pb2.Progress(completed=rec.completed, total=rec.total, stage=rec.stage,
                                    message=rec.message),
        labels=rec.labels, metrics=rec.metrics,
        outputs=[types_pb2.ArtifactRef(uri=o.uri, sha256=o.sha256, size_bytes=o.size_bytes, kind=o.kind)
                 for o in rec.outputs],
    )
    for name in ("create_time", "start_time", "end_time"):
        ts = _ts(getattr(rec, name))
        if ts is not None:
            getattr(job, name).CopyFrom(ts)
    if rec.error_code:
        job.error.CopyFrom(types_pb2.JobError(code=rec.error_code, message=rec.error_message))
    return job


def states_from_filter(flt: types_pb2.JobFilter) -> list[JobState]:
    from trace_common.errors import InvalidArgument

    out = []
    for s in flt.states:
        try:
            out.append(JobState(s))
        except ValueError:
            raise InvalidArgument(field="filter.states", expected="JOB_STATE_PENDING..JOB_STATE_CANCELLED",
                                  got=s) from None
    return out


def get(jobs: JobManager, request, response_cls):
    return response_cls(job=job_to_proto(jobs.get(request.job_id)))


def cancel(jobs: JobManager, request, response_cls):
    return response_cls(job=job_to_proto(jobs.cancel(request.job_id)))


def list_jobs(jobs: JobManager, request, response_cls):
    page, nxt = jobs.list(states_from_filter(request.filter), request.filter.run_id, request.page_size,
                          request.page_token)
    return response_cls(jobs=[job_to_proto(j) for j in page], next_page_token=nxt)


async def watch(jobs: JobManager, request, response_cls) -> AsyncIterator:
    async for rec in jobs.watch(request.job_id):
        yield response_cls(job=job_to_proto(rec))
