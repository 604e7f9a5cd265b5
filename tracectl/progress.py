"""Following a job's Watch stream with a progress bar on the terminal."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from trace_common.proto.trace.v1 import types_pb2 as t

console = Console(stderr=True)


def follow(watch_stream, description: str):
    """Consume a Watch*Job stream, drawing progress; return the final Job message."""
    last = None
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[stage]}"), TimeElapsedColumn(), console=console,
                  transient=False) as bar:
        task = bar.add_task(description, total=None, stage="")
        for msg in watch_stream:
            job = msg.job
            last = job
            total = job.progress.total or None
            bar.update(task, completed=job.progress.completed, total=total,
                       stage=job.progress.stage or t.JobState.Name(job.state).removeprefix("JOB_STATE_").lower())
    return last


def state_name(job) -> str:
    return t.JobState.Name(job.state).removeprefix("JOB_STATE_")
