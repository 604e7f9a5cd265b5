"""`tracectl.progress.follow` away from a terminal: plain lines a log file can show."""

import io
import re
from types import SimpleNamespace

import pytest
from rich.console import Console

from trace_common.proto.trace.v1 import types_pb2 as t
from tracectl import progress

RUNNING, DONE = t.JOB_STATE_RUNNING, t.JOB_STATE_SUCCEEDED


def _untimed(buf: io.StringIO) -> list[str]:
    """The printed lines without their elapsed times (" [12 s]", " after 12 s")."""
    return [re.sub(r" \[\d+ s\]$| after \d+ s$", "", ln) for ln in buf.getvalue().splitlines()]


def _stream(*updates):
    for state, done, total, stage in updates:
        yield SimpleNamespace(job=t.Job(job_id="j", state=state,
                                        progress=t.Progress(completed=done, total=total, stage=stage)))


@pytest.mark.parametrize(("updates", "expected"), [
    # one line per 10 % step, not per update; the final state closes it
    ([(RUNNING, i, 100, "") for i in range(0, 101)] + [(DONE, 100, 100, "")],
     [f"job: {i}/100 running" for i in range(0, 101, 10)] + ["job: 100/100 succeeded", "job: succeeded"]),
    # a stage change is a line of its own even within one decile
    ([(RUNNING, 1, 50, "calibrate"), (RUNNING, 2, 50, "calibrate"), (RUNNING, 2, 50, "validate"),
      (DONE, 50, 50, "")],
     ["job: 1/50 calibrate", "job: 2/50 validate", "job: 50/50 succeeded", "job: succeeded"]),
    # no total known: the count alone
    ([(RUNNING, 3, 0, "iter"), (t.JOB_STATE_FAILED, 3, 0, "")],
     ["job: 3 iter", "job: 3 failed", "job: failed"]),
])
def test_plain_progress_lines(updates, expected):
    buf = io.StringIO()
    final = progress.follow(_stream(*updates), "job", out=Console(file=buf, force_terminal=False, width=200))
    assert _untimed(buf) == expected
    assert final.state == updates[-1][0]


def test_quiet_job_still_logs_every_interval(monkeypatch):
    clock = iter([0.0, 1.0, 2.0, 70.0, 71.0, 72.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    buf = io.StringIO()
    progress.follow(_stream((RUNNING, 1, 100, ""), (RUNNING, 2, 100, ""), (RUNNING, 3, 100, ""),
                            (DONE, 100, 100, "")), "job", out=Console(file=buf, force_terminal=False))
    assert _untimed(buf)[:3] == ["job: 1/100 running", "job: 3/100 running", "job: 100/100 succeeded"]
