"""`tracectl.progress.follow` and `tracectl.progress.Reporter` away from a terminal: plain lines
a log file can show."""

import io
import re
from types import SimpleNamespace

import grpc
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
    final = progress.follow(lambda: _stream(*updates), "job", out=Console(file=buf, force_terminal=False, width=200))
    assert _untimed(buf) == expected
    assert final.state == updates[-1][0]


def test_quiet_job_still_logs_every_interval(monkeypatch):
    clock = iter([0.0, 1.0, 2.0, 70.0, 71.0, 72.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    buf = io.StringIO()
    progress.follow(lambda: _stream((RUNNING, 1, 100, ""), (RUNNING, 2, 100, ""), (RUNNING, 3, 100, ""),
                            (DONE, 100, 100, "")), "job", out=Console(file=buf, force_terminal=False))
    assert _untimed(buf)[:3] == ["job: 1/100 running", "job: 3/100 running", "job: 100/100 succeeded"]


class _RpcError(grpc.RpcError):
    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code


DEADLINE, RESET = grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize(("streams", "outcome", "opened"), [
    # each stream: the updates it delivers, then the status it ends with (None: it ends cleanly)
    ([([(RUNNING, 1, 4, "")], DEADLINE), ([(RUNNING, 2, 4, ""), (DONE, 4, 4, "")], None)], DONE, 2),
    ([([(RUNNING, 1, 4, "")], DEADLINE), ([(RUNNING, 2, 4, "")], DEADLINE), ([(DONE, 4, 4, "")], None)], DONE, 3),
    # a stream that sent nothing before its deadline: the service is not answering, raised (no spin)
    ([([], DEADLINE), ([(DONE, 4, 4, "")], None)], DEADLINE, 1),
    ([([(RUNNING, 1, 4, "")], DEADLINE), ([], DEADLINE), ([(DONE, 4, 4, "")], None)], DEADLINE, 2),
    ([([(RUNNING, 1, 4, ""), (DONE, 4, 4, "")], DEADLINE)], DONE, 1),  # already final: not reopened
    ([([(RUNNING, 1, 4, "")], RESET)], RESET, 1),  # any other failure is the caller's
])
def test_a_stream_that_reaches_its_deadline_is_reopened(streams, outcome, opened):
    calls = []

    def open_stream():
        updates, end = streams[len(calls)]
        calls.append(1)
        yield from _stream(*updates)
        if end is not None:
            raise _RpcError(end)

    out = Console(file=io.StringIO(), force_terminal=False, width=200)
    if isinstance(outcome, grpc.StatusCode):
        with pytest.raises(grpc.RpcError) as err:
            progress.follow(open_stream, "job", out=out)
        assert err.value.code() == outcome
    else:
        assert progress.follow(open_stream, "job", out=out).state == outcome
    assert len(calls) == opened


@pytest.mark.parametrize(("updates", "expected"), [
    # a detail (e.g. a training iteration's reward) rides on the line of its step
    ([(1, 3, "training", "reward 0.100"), (2, 3, "training", "reward 0.200"), (3, 3, "done", "")],
     ["it: 1/3 training  reward 0.100", "it: 2/3 training  reward 0.200", "it: 3/3 done"]),
    # many small steps of one stage: one line per 10 %
    ([(i, 20, "tasks replayed", "") for i in range(1, 21)],
     [f"it: {i}/20 tasks replayed" for i in range(1, 21) if i % 2 == 0 or i == 1]),
])
def test_reporter_plain_lines(updates, expected):
    buf = io.StringIO()
    with progress.Reporter("it", Console(file=buf, force_terminal=False, width=200)) as r:
        for done, total, stage, detail in updates:
            r.update(done, total, stage, detail)
        r.finish("done")
    assert _untimed(buf) == [*expected, "it: done"]


def test_reporter_draws_a_bar_on_a_terminal():
    buf = io.StringIO()
    with progress.Reporter("it", Console(file=buf, force_terminal=True, width=100)) as r:
        r.update(5, 10, "half")
        r.finish("done")  # the bar shows the outcome: no extra line
    text = buf.getvalue()
    assert "5/10" in text and "half" in text and "after" not in text


def test_train_follow_logs_each_iteration_off_a_terminal():
    from trace_common.grpc.client import messages
    from tracectl.commands.train import follow_training

    T = messages("trainer")

    def msg(state, it, stage, reward=None):
        m = T.WatchTrainingJobResponse(job=t.Job(job_id="tj", state=state,
                                                 progress=t.Progress(completed=it, total=2, stage=stage)))
        if reward is not None:
            m.iteration.CopyFrom(T.IterationMetrics(iteration=it, values={"reward_mean": reward, "step_seconds": 3}))
        return m

    class Stub:
        def WatchTrainingJob(self, request):
            assert request.job_id == "tj"
            yield from [msg(RUNNING, 0, "starting"), msg(RUNNING, 1, "training", 0.25),
                        msg(RUNNING, 2, "training", 0.5), msg(DONE, 2, "done")]

    buf = io.StringIO()
    final = follow_training(Stub(), "tj", Console(file=buf, force_terminal=False, width=200))
    assert final.state == DONE
    assert _untimed(buf) == [
        "train tj: 0/2 starting",
        "train tj: 1/2 training  reward 0.250  pass 0.00  informative 0.00  3.0s/it",
        "train tj: 2/2 training  reward 0.500  pass 0.00  informative 0.00  3.0s/it",
        "train tj: 2/2 succeeded", "train tj: succeeded"]
