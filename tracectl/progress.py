"""Following a job's Watch stream: a progress bar on a terminal, plain log lines elsewhere.

On a terminal, rich draws a live bar. When stderr is not a terminal (nohup, CI logs, `| tee`), rich
would print the bar only once, at the end, so a multi-hour stage would look hung. There `follow`
prints one plain line per 10 % of progress (and per stage change, and at least every
`LOG_INTERVAL_S` seconds while updates arrive), then a final line with the job's state.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from trace_common.proto.trace.v1 import types_pb2 as t

console = Console(stderr=True)

#: Longest quiet period between plain progress lines while the job reports progress.
LOG_INTERVAL_S = 60.0


def follow(watch_stream, description: str, out: Console | None = None):
    """Consume a Watch*Job stream, showing progress on `out` (default: stderr); return the final Job."""
    out = out or console
    if not out.is_terminal:
        return _follow_plain(watch_stream, description, out)
    last = None
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[stage]}"), TimeElapsedColumn(), console=out,
                  transient=False) as bar:
        task = bar.add_task(description, total=None, stage="")
        for msg in watch_stream:
            job = msg.job
            last = job
            total = job.progress.total or None
            bar.update(task, completed=job.progress.completed, total=total, stage=_stage(job))
    return last


def _follow_plain(watch_stream, description: str, out: Console):
    start = last_line = time.monotonic()
    last, logged = None, (None, -1)  # (stage, decile) of the last printed line
    for msg in watch_stream:
        job = last = msg.job
        done, total = job.progress.completed, job.progress.total
        decile = min(10, done * 10 // total) if total else -1
        stage, now = _stage(job), time.monotonic()
        if (stage, decile) != logged or now - last_line >= LOG_INTERVAL_S:
            count = f"{done}/{total}" if total else f"{done}"
            out.print(f"{description}: {count} {stage} [{now - start:.0f} s]", highlight=False)
            logged, last_line = (stage, decile), now
    if last is not None:
        out.print(f"{description}: {state_name(last).lower()} after {time.monotonic() - start:.0f} s",
                  highlight=False)
    return last


def _stage(job) -> str:
    return job.progress.stage or state_name(job).lower()


def state_name(job) -> str:
    return t.JobState.Name(job.state).removeprefix("JOB_STATE_")
