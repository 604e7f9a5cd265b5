"""The worker's event protocol: stdout lines the local executor parses, and the bounded event
log in the artifact store that the Kubernetes executor polls."""

from __future__ import annotations

import json

import pytest

from services.trainer.executors import _kill_hint, error_from_event
from services.trainer.jobspec import EVENT_PREFIX, decode_line, encode_event
from services.trainer.worker import EventSink
from trace_common.artifacts import open_store
from trace_common.errors import FailedPrecondition, NotFound, TraceError, Unavailable


@pytest.mark.parametrize("line, expected", [
    (EVENT_PREFIX + encode_event("iteration", {"iteration": 3, "values": {"loss": 0.5}}),
     {"event": "iteration", "iteration": 3, "values": {"loss": 0.5}}),
    ("Loading weights: 100%", None),                          # ordinary output is ignored
    (EVENT_PREFIX + "{not json", None),
    (EVENT_PREFIX + json.dumps({"no": "event"}), None),
])
def test_decode_line(line, expected):
    assert decode_line(line) == expected


@pytest.mark.parametrize("event, cls", [
    ({"event": "error", "code": "NOT_FOUND", "message": "m"}, NotFound),
    ({"event": "error", "code": "UNAVAILABLE", "message": "m"}, Unavailable),
    ({"event": "error", "code": "FAILED_PRECONDITION", "message": "m"}, FailedPrecondition),
    ({"event": "error", "code": "SOMETHING_ELSE", "message": "m"}, TraceError),
])
def test_error_events_keep_their_status(event, cls):
    err = error_from_event(event)
    assert type(err) is cls and err.reason == "m"


def test_store_log_is_bounded_and_keeps_every_other_event(tmp_path, capsys):
    store = open_store(tmp_path.as_uri())
    sink = EventSink(store=store, key="runs/r/adapters/c/jobs/j/events.jsonl", keep_iterations=3, min_interval_s=0)
    sink.emit("checkpoint", {"iteration": 0, "uri": "u", "sha256": "s", "size": 1})
    for it in range(1, 8):
        sink.emit("phase", {"iteration": it, "phase": "playing 8 episodes"})
        sink.emit("phase", {"iteration": it, "phase": "updating on 8 episodes"})
        sink.emit("iteration", {"iteration": it, "values": {}})
    sink.emit("phase", {"iteration": 8, "phase": "playing 8 episodes"})   # only the latest phase is kept
    sink.emit("result", {"iterations": 7})
    lines = [json.loads(x) for x in store.get_bytes("runs/r/adapters/c/jobs/j/events.jsonl").splitlines()]
    assert [(e["event"], e.get("iteration")) for e in lines] == [
        ("checkpoint", 0), ("iteration", 5), ("iteration", 6), ("iteration", 7), ("phase", 8), ("result", None)]
    out = [decode_line(x) for x in capsys.readouterr().out.splitlines()]
    assert len(out) == 24 and all(out)                       # stdout gets every event


def test_iteration_writes_are_throttled_but_final_events_are_not(tmp_path, capsys):
    store = open_store(tmp_path.as_uri())
    sink = EventSink(store=store, key="e.jsonl", min_interval_s=3600)
    sink.emit("iteration", {"iteration": 1, "values": {}})   # first write goes through
    sink.emit("iteration", {"iteration": 2, "values": {}})   # throttled
    assert len(store.get_bytes("e.jsonl").splitlines()) == 1
    sink.emit("error", {"code": "INTERNAL", "message": "x"})
    assert [json.loads(x)["event"] for x in store.get_bytes("e.jsonl").splitlines()] == [
        "iteration", "iteration", "error"]


@pytest.mark.parametrize("rc, fragment", [
    (-9, "out-of-memory killer"),     # SIGKILL nobody in TRACE sent: say what it likely was and what to lower
    (-15, ""),                        # SIGTERM: an ordinary stop, no guess
    (1, ""),
    (None, ""),
])
def test_kill_hint(rc, fragment):
    hint = _kill_hint(rc)
    assert (fragment in hint) if fragment else hint == ""
    if fragment:
        assert "gradient_accumulation_steps" in hint and "training.parallel" in hint


class _Ctx:
    """Records what a job's progress was set to (the part of JobContext `_on_event` uses for these events)."""

    def __init__(self):
        self.calls = []

    def progress(self, **kw):
        self.calls.append(kw)


@pytest.mark.parametrize("event, expected", [
    ({"event": "warm_start", "step": 40, "loss": 0.5770475268363953},
     {"stage": "gate warm start", "message": "step 40, loss 0.5770"}),
    ({"event": "warm_start", "step": 0, "loss": None}, {"stage": "gate warm start", "message": "step 0, loss n/a"}),
    ({"event": "phase", "iteration": 3, "phase": "playing 32 episodes"},
     {"completed": 2, "stage": "iteration 3: playing 32 episodes"}),
    ({"event": "checkpoint", "iteration": 4}, {"stage": "checkpoint 4"}),
])
def test_events_become_job_progress(event, expected):
    from services.trainer.service import Training

    ctx = _Ctx()
    Training._on_event(None, ctx, "cap", event)   # these events touch no service state
    assert ctx.calls == [expected]
