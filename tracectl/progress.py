"""Progress display of `tracectl`: a live rich bar on a terminal, plain lines elsewhere.

When stderr is not a terminal (nohup, CI logs, `| tee`), rich would print its bar only once, at
the end, so a multi-hour stage would look hung. There `Reporter` prints one plain line per 10 %
of progress (and per stage change, and at least every `LOG_INTERVAL_S` seconds while updates
arrive), then a final line with the outcome. Every progress display of `tracectl` uses it:
`follow` for job Watch streams, `tracectl train --follow`, `tracectl tau2 replay-gold`.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from trace_common.proto.trace.v1 import types_pb2 as t

console = Console(stderr=True)

#: Longest quiet period between plain progress lines while progress arrives.
LOG_INTERVAL_S = 60.0


class Reporter:
    """Progress of one task: a live rich bar on a terminal, plain lines elsewhere.

    `update(completed, total, stage, detail)` as often as progress arrives; a plain line is printed
    when the stage or the 10 % step changes, or `LOG_INTERVAL_S` passed since the last one.
    `finish(state)` prints the closing line (plain mode only: the bar already shows it)."""

    def __init__(self, description: str, out: Console | None = None):
        self.description, self.out = description, out or Console(stderr=True)
        self.plain = not self.out.is_terminal
        self._start = self._last_line = time.monotonic()
        self._logged: tuple[str, int] | None = None  # (stage, decile) of the last plain line
        self._bar: Progress | None = None

    def __enter__(self) -> Reporter:
        if not self.plain:
            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[stage]}"), TimeElapsedColumn(), console=self.out,
                                 transient=False)
            self._bar.start()
            self._task = self._bar.add_task(self.description, total=None, stage="")
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def update(self, completed: int, total: int, stage: str, detail: str = "") -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=completed, total=total or None, stage=detail or stage)
            return
        decile = min(10, completed * 10 // total) if total else -1
        now = time.monotonic()
        if (stage, decile) != self._logged or now - self._last_line >= LOG_INTERVAL_S:
            count = f"{completed}/{total}" if total else f"{completed}"
            extra = f"  {detail}" if detail else ""
            self.out.print(f"{self.description}: {count} {stage}{extra} [{now - self._start:.0f} s]",
                           highlight=False)
            self._logged, self._last_line = (stage, decile), now

    def finish(self, state: str) -> None:
        if self.plain:
            self.out.print(f"{self.description}: {state} after {time.monotonic() - self._start:.0f} s",
                           highlight=False)



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
