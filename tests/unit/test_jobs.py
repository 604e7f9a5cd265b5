"""The job state machine shared by every service (domain level, no gRPC)."""

import asyncio

import pytest

from trace_common import errors
from trace_common.jobs import JobManager, JobState, Output
from trace_common.metrics import ServiceMetrics


def run(coro):
    return asyncio.run(coro)


async def _ok(ctx):
    ctx.progress(completed=1, total=2, stage="half")
    ctx.add_output(Output("file:///x", "ab" * 32, 3, "test"))
    ctx.set_metrics({"reward_mean": 0.5})
    await asyncio.sleep(0)
    ctx.progress(completed=2)
    return {"done": True}


async def _fails_domain(ctx):
    raise errors.Unavailable("llm endpoint down")


async def _crashes(ctx):
    raise ZeroDivisionError("boom")


async def _forever(ctx):
    await asyncio.sleep(3600)


@pytest.mark.parametrize(("body", "state", "code", "message"), [
    (_ok, JobState.SUCCEEDED, "", ""),
    (_fails_domain, JobState.FAILED, "UNAVAILABLE", "llm endpoint down"),
    (_crashes, JobState.FAILED, "INTERNAL", "ZeroDivisionError: boom"),
])
def test_job_outcomes(body, state, code, message):
    async def go():
        m = ServiceMetrics("unittest")
        jm = JobManager("unittest", m)
        rec = jm.submit("kind", body)
        assert rec.state == JobState.PENDING
        final = await jm.wait(rec.job_id, timeout=5)
        assert final.state == state
        assert final.error_code == code
        assert message in final.error_message
        assert m.jobs.labels("kind", state.name.lower())._value.get() == 1
        assert m.jobs_active.labels("kind")._value.get() == 0
        return final
    final = run(go())
    if state == JobState.SUCCEEDED:
        assert final.result == {"done": True} and final.completed == 2 and final.total == 2
        assert final.outputs[0].kind == "test" and final.metrics == {"reward_mean": 0.5}


def test_watch_sees_every_change_and_ends_on_terminal():
    async def go():
        jm = JobManager("unittest")
        rec = jm.submit("kind", _ok)
        seen = [r async for r in jm.watch(rec.job_id)]
        assert seen[-1].state == JobState.SUCCEEDED
        assert [r.version for r in seen] == sorted({r.version for r in seen})
        assert JobState.RUNNING in {r.state for r in seen}
    run(go())


@pytest.mark.parametrize("start_first", [True, False])
def test_cancel_running_and_pending(start_first):
    async def go():
        jm = JobManager("unittest", max_concurrent=1)
        blocker = jm.submit("kind", _forever)
        rec = jm.submit("kind", _forever)
        await asyncio.sleep(0.01)
        target = blocker if start_first else rec
        assert jm.get(target.job_id).state == (JobState.RUNNING if start_first else JobState.PENDING)
        jm.cancel(target.job_id)
        final = await jm.wait(target.job_id, timeout=5)
        assert final.state == JobState.CANCELLED
        assert jm.cancel(target.job_id).state == JobState.CANCELLED  # idempotent
        await jm.shutdown()
    run(go())


def test_cancel_finished_job_is_failed_precondition():
    async def go():
        jm = JobManager("unittest")
        rec = jm.submit("kind", _ok)
        await jm.wait(rec.job_id, 5)
        with pytest.raises(errors.FailedPrecondition, match="already ended"):
            jm.cancel(rec.job_id)
    run(go())


def test_request_id_makes_create_idempotent():
    async def go():
        jm = JobManager("unittest")
        a = jm.submit("kind", _ok, request_id="r1")
        b = jm.submit("kind", _ok, request_id="r1")
        c = jm.submit("kind", _ok, request_id="r2")
        assert a.job_id == b.job_id != c.job_id
        await jm.shutdown()
    run(go())


@pytest.mark.parametrize(("kwargs", "field"), [
    (dict(run_id="bad run id"), "run_id"),
    (dict(run_id="-leading"), "run_id"),
    (dict(labels={"Bad Key": "v"}), "labels"),
    (dict(labels={f"k{i}": "v" for i in range(17)}), "labels"),
    (dict(labels={"k": "v" * 300}), "labels"),
    (dict(request_id="r" * 200), "request_id"),
])
def test_submit_rejects_bad_input(kwargs, field):
    async def go():
        jm = JobManager("unittest")
        with pytest.raises(errors.InvalidArgument, match=field):
            jm.submit("kind", _ok, **kwargs)
        assert jm.list()[0] == []
    run(go())


def test_queue_limit_is_resource_exhausted():
    async def go():
        jm = JobManager("unittest", max_concurrent=1, max_queued=2)
        jm.submit("kind", _forever)
        jm.submit("kind", _forever)
        with pytest.raises(errors.ResourceExhausted, match="limit 2"):
            jm.submit("kind", _forever)
        await jm.shutdown()
    run(go())


def test_list_filters_and_pages():
    async def go():
        jm = JobManager("unittest")
        ids = [jm.submit("kind", _ok, run_id="a" if i % 2 else "b").job_id for i in range(7)]
        for i in ids:
            await jm.wait(i, 5)
        page1, tok = jm.list(page_size=3)
        page2, tok2 = jm.list(page_size=3, page_token=tok)
        page3, tok3 = jm.list(page_size=3, page_token=tok2)
        assert len(page1) == 3 and len(page2) == 3 and len(page3) == 1 and tok3 == ""
        assert len({j.job_id for j in page1 + page2 + page3}) == 7
        assert {j.run_id for j in jm.list(run_id="a")[0]} == {"a"}
        assert jm.list(states=[JobState.FAILED])[0] == []
        for bad in (dict(page_size=-1), dict(page_size=5000), dict(page_token="%%%")):
            with pytest.raises(errors.InvalidArgument):
                jm.list(**bad)
    run(go())


@pytest.mark.parametrize("job_id", ["", "nope"])
def test_unknown_job(job_id):
    async def go():
        jm = JobManager("unittest")
        with pytest.raises((errors.NotFound, errors.InvalidArgument)):
            jm.get(job_id)
    run(go())
