"""Following a job's Watch stream: a progress bar on a terminal, plain log lines elsewhere.

The display itself is `trace_common.progress.Reporter` (a bar on a terminal; off a terminal one
plain line per 10 %, per stage change and at least once a minute, then the job's final state).
"""

from __future__ import annotations

from rich.console import Console

from trace_common.progress import Reporter
from trace_common.proto.trace.v1 import types_pb2 as t

console = Console(stderr=True)


def follow(watch_stream, description: str, out: Console | None = None):
    """Consume a Watch*Job stream, showing progress on `out` (default: stderr); return the final Job."""
    last = None
    with Reporter(description, out or console) as report:
        for msg in watch_stream:
            job = last = msg.job
            report.update(job.progress.completed, job.progress.total, _stage(job))
        if last is not None:
            report.finish(state_name(last).lower())
    return last


def _stage(job) -> str:
    return job.progress.stage or state_name(job).lower()


def state_name(job) -> str:
    return t.JobState.Name(job.state).removeprefix("JOB_STATE_")
