"""Progress display of `tracectl`: a live rich bar on a terminal, plain lines elsewhere.

When stderr is not a terminal (nohup, CI logs, `| tee`), rich would print its bar only once, at
the end, so a multi-hour stage would look hung. There `Reporter` prints one plain line per 10 %
of progress (and per stage change, and at least every `LOG_INTERVAL_S` seconds while updates
arrive), then a final line with the outcome; a heartbeat thread prints the latest state whenever
`LOG_INTERVAL_S` passed without a line (marked "still running" when no update came since the last
line), so even a phase that sends no update for minutes shows up once a minute. Every progress display of `tracectl` uses it:
`follow` for job Watch streams (showing each job's stage and its message, e.g. a base-agent
build's step, loss and ETA), `tracectl train` (following its job), `tracectl tau2 replay-gold`,
`tracectl agents build`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

import grpc
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from trace_common.proto.trace.v1 import types_pb2 as t

console = Console(stderr=True)

#: The states a job never leaves.
TERMINAL = frozenset({t.JOB_STATE_SUCCEEDED, t.JOB_STATE_FAILED, t.JOB_STATE_CANCELLED})

#: Longest quiet period between plain progress lines while progress arrives.
LOG_INTERVAL_S = 60.0


class Reporter:
    """Progress of one task: a live rich bar on a terminal, plain lines elsewhere.

    `update(completed, total, stage, detail)` as often as progress arrives; a plain line is printed
    when the stage or the 10 % step changes, or `interval_s` passed since the last one; with no
    update for `interval_s`, the heartbeat repeats the last state. `finish(state)` prints the
    closing line (plain mode only: the bar already shows it)."""

    def __init__(self, description: str, out: Console | None = None, *, interval_s: float | None = None):
        self.description, self.out = description, out or Console(stderr=True)
        self.plain = not self.out.is_terminal
        self.interval_s = LOG_INTERVAL_S if interval_s is None else interval_s
        self._start = self._last_line = time.monotonic()
        self._logged: tuple[str, int] | None = None  # (stage, decile) of the last plain line
        self._state: tuple[int, int, str, str] | None = None  # the last update
        self._fresh = False  # an update arrived since the last plain line
        self._bar: Progress | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._heart: threading.Thread | None = None

    def __enter__(self) -> Reporter:
        if not self.plain:
            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[stage]}"), TimeElapsedColumn(), console=self.out,
                                 transient=False)
            self._bar.start()
            self._task = self._bar.add_task(self.description, total=None, stage="")
        else:
            self._heart = threading.Thread(target=self._heartbeat, name=f"progress-{self.description}"[:40],
                                           daemon=True)
            self._heart.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._heart is not None:
            self._heart.join(timeout=5)
        if self._bar is not None:
            self._bar.stop()

    def update(self, completed: int, total: int, stage: str, detail: str = "") -> None:
        if self._bar is not None:
            shown = f"{stage}: {detail}" if stage and detail else detail or stage
            self._bar.update(self._task, completed=completed, total=total or None, stage=shown)
            return
        with self._lock:
            self._state, self._fresh = (completed, total, stage, detail), True
            decile = min(10, completed * 10 // total) if total else -1
            now = time.monotonic()
            if (stage, decile) != self._logged or now - self._last_line >= self.interval_s:
                self._line(now)
                self._logged = (stage, decile)

    def _line(self, now: float, still: bool = False) -> None:
        """Print the last state as a plain line (caller holds the lock)."""
        if self._state is None:
            text = f"{self.description}: started"
        else:
            completed, total, stage, detail = self._state
            count = f"{completed}/{total} " if total else f"{completed} " if completed else ""
            extra = f"  {detail}" if detail else ""
            text = f"{self.description}: {count}{stage}{extra}"
        # soft_wrap: one physical line per message, however long (rich wraps at 80 columns off a terminal)
        self.out.print(f"{text}{' (still running)' if still else ''} [{now - self._start:.0f} s]", highlight=False,
                       soft_wrap=True)
        self._last_line, self._fresh = now, False

    def _heartbeat(self) -> None:
        # Event.wait sleeps on the C clock; time.monotonic is read only when a check is due.
        while not self._stop.wait(max(0.05, self.interval_s / 4)):
            with self._lock:
                now = time.monotonic()
                if not self._stop.is_set() and now - self._last_line >= self.interval_s:
                    self._line(now, still=not self._fresh)  # "still running": nothing new since the last line

    def finish(self, state: str) -> None:
        if self.plain:
            with self._lock:
                self.out.print(f"{self.description}: {state} after {time.monotonic() - self._start:.0f} s",
                               highlight=False, soft_wrap=True)


def follow(open_stream: Callable[[], Iterable], description: str, out: Console | None = None, *,
           describe: Callable[[object], tuple[str, str]] | None = None):
    """Consume a Watch*Job stream, opened by `open_stream()`, showing progress on `out` (default:
    stderr); return the last Job seen. `describe(message)` gives the (stage, detail) shown for one
    message (default: the job's stage and its progress message). The channel's Watch deadline
    (`trace_common.grpc.client`) bounds one stream, not the job: a stream that ends at it
    (DEADLINE_EXCEEDED) before the job reached a final state is opened again, and goes on from the
    job's current state (a Watch stream starts with the job as it is now). A stream that reached its
    deadline without sending even that first message is raised: the service did not answer within
    the deadline, and opening it again would only spin."""
    describe = describe or _job_line
    last = None
    with Reporter(description, out or console) as report:
        while True:
            seen = 0
            try:
                for msg in open_stream():
                    job = last = msg.job
                    seen += 1
                    report.update(job.progress.completed, job.progress.total, *describe(msg))
                break
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED or not seen:
                    raise
                if last.state in TERMINAL:
                    break
        if last is not None:
            report.finish(state_name(last).lower())
    return last


def _job_line(msg) -> tuple[str, str]:
    return _stage(msg.job), msg.job.progress.message


def _stage(job) -> str:
    return job.progress.stage or state_name(job).lower()


def state_name(job) -> str:
    return t.JobState.Name(job.state).removeprefix("JOB_STATE_")
