"""A base-agent build is never silent: a tiny `micro` build reports every phase and, during
training, an event at least every `report_every` steps with its step count and loss; off a
terminal `tracectl`'s Reporter turns them into plain one-line messages; inside a service job the
same events become the job's progress (stage + message), from the worker thread the build runs on."""

from __future__ import annotations

import asyncio
import io
import math
import re

import pytest
from rich.console import Console

from trace_common.agents import (
    MicroConfig,
    SFTConfig,
    WarmStartData,
    build_micro,
    read_meta,
    resolve_base_agent,
)
from trace_common.agents.progress import BuildEvent, StepClock, job_stage, throttled
from trace_common.jobs import JobManager, current_job
from tracectl.commands.agents import show_events
from tracectl.progress import Reporter

#: 12 copying + 8 imitation steps on a one-layer model: a few seconds.
TOY = MicroConfig(hidden_size=64, num_layers=1, intermediate_size=64, num_kv_heads=1, vocab_size=512,
                  data=WarmStartData(episodes=8), sft=SFTConfig(steps=8, batch_size=2, copy_steps=12,
                                                                copy_batch_size=4, max_seq_len=4096))
TOTAL = 20


def step_events(events: list[BuildEvent]) -> list[BuildEvent]:
    return [e for e in events if e.phase in ("copying", "imitation") and e.step > 0]


@pytest.mark.parametrize("report_every", [3, 5])
def test_training_reports_at_least_every_n_steps_with_loss(tmp_path, report_every):
    events: list[BuildEvent] = []
    build_micro(TOY, tmp_path, progress=events.append, report_every=report_every, probe_episodes=0)
    steps = step_events(events)
    assert [e.step for e in steps][-1] == TOTAL and all(e.total == TOTAL for e in steps)
    gaps = [b.step - a.step for a, b in zip([BuildEvent("micro", "copying")] + steps, steps, strict=False)]
    assert max(gaps) <= report_every, gaps
    assert all(e.loss is not None and math.isfinite(e.loss) and e.loss > 0 for e in steps)
    assert {e.phase for e in steps} == {"copying", "imitation"}
    assert [e.phase for e in steps if e.step <= 12] == ["copying"] * len([e for e in steps if e.step <= 12])
    assert all(e.eta_s is not None and e.eta_s >= 0 for e in steps)
    assert steps[-1].eta_s == 0
    phases = [e.phase for e in events if e.step == 0]
    assert phases[:2] == ["data", "tokenizer"] and phases[-2:] == ["evaluating", "saving"]


def test_first_use_says_what_why_and_where_then_the_cache_is_silent(tmp_path):
    events: list[BuildEvent] = []
    model_dir = resolve_base_agent("micro", tmp_path, config=TOY, progress=events.append)
    start = next(e for e in events if e.phase == "start")
    assert "first use" in start.message and str(model_dir) in start.message and "micro" in start.message
    assert events[-1].phase == "done" and str(model_dir) in events[-1].message
    assert read_meta(model_dir)["source"] == "built"
    again: list[BuildEvent] = []
    assert resolve_base_agent("micro", tmp_path, config=TOY, progress=again.append) == model_dir
    assert again == []  # cached: nothing to report


def test_off_a_terminal_the_reporter_prints_plain_lines(tmp_path):
    buf = io.StringIO()
    with Reporter("base agent micro", Console(file=buf, force_terminal=False, width=80)) as report:
        resolve_base_agent("micro", tmp_path, config=TOY, progress=show_events(report))
        report.finish("ready")
    lines = buf.getvalue().splitlines()
    assert all(ln.startswith("base agent micro: ") for ln in lines), lines  # one physical line each, no wrapping
    trained = [ln for ln in lines if re.search(r"\d+/20 (copying|imitation)  step \d+/20 loss \d+\.\d{4}", ln)]
    assert len(trained) >= 3, lines  # per stage change and per 10 % of the steps
    assert any("first use" in ln and "cached at" in ln for ln in lines)
    assert lines[-1].startswith("base agent micro: ready after")


@pytest.mark.parametrize(("later", "marked"), [
    (None, True),                                              # nothing new: the last state, "still running"
    ((4, 10, "building base agent micro", "copying step 4/10"), False),  # same decile: shown by the heartbeat
], ids=["quiet", "news within the decile"])
def test_reporter_heartbeat_prints_a_line_every_interval(later, marked):
    import time

    buf = io.StringIO()
    with Reporter("job", Console(file=buf, force_terminal=False, width=200), interval_s=0.3) as report:
        report.update(3, 10, "building base agent micro", "copying step 3/10")
        if later:
            report.update(*later)
        time.sleep(0.5)
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("job: 3/10 building base agent micro  copying step 3/10 [")
    beat = lines[1]
    assert ("copying step 4/10" if later else "copying step 3/10") in beat
    assert ("(still running)" in beat) is marked, lines


def test_inside_a_job_the_build_is_the_jobs_progress(tmp_path):
    """The build runs on a worker thread (`asyncio.to_thread`, as `open_policy` does); its events
    reach the job's record through the job's event loop."""
    async def main():
        jobs = JobManager("rollout")
        seen: list = []

        async def body(ctx):
            assert current_job() is ctx
            path = await asyncio.to_thread(resolve_base_agent, "micro", tmp_path, config=TOY)
            return str(path)

        rec = jobs.submit("rollout", body)
        async for snap in jobs.watch(rec.job_id):
            seen.append(snap)
        return seen

    seen = asyncio.run(main())
    assert seen[-1].state.name == "SUCCEEDED"
    stages = [s.stage for s in seen]
    assert "building base agent micro" in stages and stages[-1] == "base agent micro ready"
    training = [s for s in seen if s.stage == "building base agent micro" and s.total == TOTAL and s.completed]
    assert training and all(re.match(r"(copying|imitation) step \d+/20 loss", s.message) for s in training)
    assert training[-1].completed == TOTAL


def test_current_job_reaches_threads_and_other_event_loops():
    """How the calibration policy host opens models: a coroutine submitted to another thread's
    loop (`run_coroutine_threadsafe`) that loads in `asyncio.to_thread`; the job is seen there."""
    import threading

    other = asyncio.new_event_loop()
    thread = threading.Thread(target=other.run_forever, daemon=True)
    thread.start()

    async def main():
        jobs = JobManager("environment")

        async def body(ctx):
            async def on_host():
                return await asyncio.to_thread(current_job)
            found = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(on_host(), other))
            await asyncio.to_thread(ctx.progress, completed=1, total=2, stage="from a thread")
            await asyncio.sleep(0)
            return found is ctx and ctx.record.stage == "from a thread" and ctx.record.completed == 1

        rec = jobs.submit("environment", body)
        return (await jobs.wait(rec.job_id, timeout=10)).result

    try:
        assert asyncio.run(main()) is True and current_job() is None
    finally:
        other.call_soon_threadsafe(other.stop)
        thread.join(5)


@pytest.mark.parametrize(("phase", "stage"), [
    ("start", "building base agent micro"), ("imitation", "building base agent micro"),
    ("waiting", "waiting for base agent micro"), ("installing", "installing base agent micro"),
    ("data", "checking base agent micro"), ("done", "base agent micro ready"),
])
def test_job_stage_per_phase(phase, stage):
    assert job_stage(BuildEvent("micro", phase)) == stage


def test_throttle_keeps_phase_changes_and_the_last_step():
    out: list[BuildEvent] = []
    forward = throttled(out.append, 3600)
    for step in range(1, 11):
        forward(BuildEvent("micro", "copying" if step <= 6 else "imitation", step=step, total=10))
    assert [(e.phase, e.step) for e in out] == [("copying", 1), ("imitation", 7), ("imitation", 10)]


@pytest.mark.parametrize(("ticks", "expected"), [
    # 2 copying steps of 1 unit each done: 2 copying left (1 each) + 4 imitation (1 * 100/50 * 2.5 = 5 each)
    ([1.0, 1.0], 2 * 1.0 + 4 * 5.0),
    # into imitation: its own measured rate (3 per step) for the 3 left
    ([1.0, 1.0, 1.0, 1.0, 3.0], 3 * 3.0),
])
def test_eta_uses_each_phases_rate(monkeypatch, ticks, expected):
    import trace_common.agents.progress as progress

    now = [0.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    clock = StepClock(copy_steps=4, steps=4, copy_tokens_per_step=50, imitation_tokens_per_step=100)
    for step, dt in enumerate(ticks, start=1):
        now[0] += dt
        clock.tick(step)
    assert clock.eta(len(ticks)) == pytest.approx(expected)
