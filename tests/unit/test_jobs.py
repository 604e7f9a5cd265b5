"""The job state machine shared by every service (domain level, no gRPC)."""

import asyncio

import pytest

from trace_common import errors
from trace_common.jobs import MAX_WATCHERS_PER_JOB, WATCH_QUEUE, JobManager, JobState, Output
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


async def _chatty(ctx):
    for i in range(10 * WATCH_QUEUE):
        ctx.progress(i, 10 * WATCH_QUEUE)
    return {"done": True}


def test_a_slow_watcher_holds_a_bounded_queue_and_still_sees_the_end():
    async def go():
        jm = JobManager("unittest")
        rec = jm.submit("kind", _chatty)
        stream = jm.watch(rec.job_id)
        first = await stream.__anext__()                  # registered; reads nothing while the job runs
        await jm.wait(rec.job_id, timeout=10)
        queued = [q.qsize() for q in jm._watchers[rec.job_id]]
        rest = [r async for r in stream]
        assert first.state == JobState.PENDING and max(queued) <= WATCH_QUEUE, queued
        assert len(rest) == WATCH_QUEUE and rest[-1].state == JobState.SUCCEEDED   # the oldest were dropped
        assert [r.version for r in rest] == sorted(r.version for r in rest)
    run(go())


@pytest.mark.parametrize(("open_streams", "refused"), [(MAX_WATCHERS_PER_JOB - 1, False), (MAX_WATCHERS_PER_JOB, True)])
def test_watchers_per_job_are_capped(open_streams, refused):
    async def go():
        jm = JobManager("unittest")
        rec = jm.submit("kind", _forever)
        streams = [jm.watch(rec.job_id) for _ in range(open_streams)]
        for s in streams:
            await s.__anext__()
        extra = jm.watch(rec.job_id)
        try:
            if refused:
                with pytest.raises(errors.ResourceExhausted, match="poll Get…Job instead"):
                    await extra.__anext__()
            else:
                assert (await extra.__anext__()).job_id == rec.job_id
        finally:
            for s in [*streams, extra]:
                await s.aclose()
            assert not jm._watchers[rec.job_id]           # closed streams unregister
            jm.cancel(rec.job_id)
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


MIB = 1 << 20


@pytest.mark.parametrize(("caps", "footprints", "accepted", "fragment"), [
    # count cap: one job runs, two wait; the fourth would be a third pending job
    (dict(max_pending=2), [0, 0, 0, 0], 3, "2 unittest jobs are pending (limit 2, TRACE_UNITTEST_MAX_PENDING_JOBS)"),
    # bytes cap: 3 x 1 MiB wait within 3.5 MiB (the running job's footprint is released when it starts)
    (dict(max_pending_bytes=3 * MIB + MIB // 2), [MIB] * 5, 4, "over the limit of 3.5 MiB of pending specs"),
    # one spec larger than the whole cap is refused even with nothing pending
    (dict(max_pending_bytes=2 * MIB), [0, 3 * MIB], 1, "this one 3.0 MiB"),
])
def test_pending_caps_are_resource_exhausted_with_a_retry_hint(caps, footprints, accepted, fragment):
    async def go():
        jm = JobManager("unittest", max_concurrent=1, **caps)
        done = 0
        for fp in footprints:
            try:
                jm.submit("kind", _forever, footprint=fp)
            except errors.ResourceExhausted as err:
                assert fragment in str(err) and "retry after some of them start or finish" in str(err), str(err)
                break
            done += 1
            await asyncio.sleep(0)        # the first job starts running, releasing its pending room
        assert done == accepted
        await jm.shutdown()
    run(go())


@pytest.mark.parametrize("how", ["cancel", "start"])
def test_pending_room_is_released_when_a_job_leaves_pending(how):
    async def go():
        jm = JobManager("unittest", max_concurrent=1, max_pending=1, max_pending_bytes=2 * MIB)
        blocker = jm.submit("kind", _forever, footprint=MIB)
        await asyncio.sleep(0)
        waiting = jm.submit("kind", _forever, footprint=MIB)
        assert jm.pending_bytes == MIB
        with pytest.raises(errors.ResourceExhausted):
            jm.submit("kind", _forever)
        if how == "cancel":
            jm.cancel(waiting.job_id)
        else:
            jm.cancel(blocker.job_id)
            await asyncio.sleep(0.01)     # `waiting` takes the slot
            assert jm.get(waiting.job_id).state == JobState.RUNNING
        assert jm.pending_bytes == 0
        jm.submit("kind", _forever, footprint=MIB)
        await jm.shutdown()
    run(go())


def test_a_cancelled_pending_job_drops_its_body():
    """The closure over a pending job's spec is freed once the job is cancelled (nothing keeps it)."""
    import gc
    import weakref

    class Spec:
        pass

    async def go():
        jm = JobManager("unittest", max_concurrent=1)
        jm.submit("kind", _forever)
        spec = Spec()
        ref = weakref.ref(spec)

        async def body(ctx, spec=spec):
            await asyncio.sleep(3600)
        rec = jm.submit("kind", body, footprint=1)
        del spec, body
        await asyncio.sleep(0)
        assert ref() is not None          # held while pending
        jm.cancel(rec.job_id)
        assert ref() is None              # at once: its task never holds it (nor a cancelled task's traceback)
        await asyncio.sleep(0.01)
        gc.collect()
        assert ref() is None
        await jm.shutdown()
    run(go())


@pytest.mark.parametrize(("spec", "pickled"), [
    ({"task_ids": [str(i) for i in range(10_000)], "prompt": "p" * 60_000}, True),
    ({"factory": lambda: None, "task_ids": ["1", "2"]}, False),    # cannot be pickled: held as is
])
def test_a_spec_waits_pickled_and_the_body_reads_it_back(spec, pickled):
    import pickle

    from trace_common.jobs import estimate_footprint

    async def go():
        jm = JobManager("unittest", max_concurrent=1)
        blocker = jm.submit("kind", _forever)
        await asyncio.sleep(0)
        seen = []

        async def body(ctx):
            seen.append(ctx.spec)
        rec = jm.submit("kind", body, spec=spec)
        expected = len(pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL)) if pickled else estimate_footprint(spec)
        assert jm.pending_bytes == expected
        assert isinstance(jm._specs[rec.job_id][0], bytes) is pickled
        jm.cancel(blocker.job_id)
        assert (await jm.wait(rec.job_id, 5)).state == JobState.SUCCEEDED
        assert seen[0]["task_ids"] == spec["task_ids"] and (seen[0] is spec) is not pickled
        assert jm._specs == {} and jm._bodies == {}
    run(go())


@pytest.mark.parametrize(("value", "at_least"), [
    ("x" * 100_000, 100_000),
    ([f"t{i:05d}" for i in range(10_000)], 10_000 * 50),     # each id is an object of its own
    ({"a": ["x" * 1000] * 3}, 1000),                          # a shared object counts once
])
def test_estimate_footprint_counts_what_a_value_holds(value, at_least):
    from trace_common.jobs import estimate_footprint

    got = estimate_footprint(value)
    assert at_least <= got < at_least * 3 + 10_000, got


def test_estimate_footprint_walks_pydantic_specs():
    from services.rollout.specs import RolloutSpecModel
    from trace_common.jobs import estimate_footprint

    def spec(n: int, prompt: int):
        return RolloutSpecModel.model_validate({
            "environment": {"name": "store"}, "policy": {"backend": "POLICY_BACKEND_SCRIPTED", "model": "m"},
            "tasks": {"task_ids": [str(i) for i in range(n)]}, "system_prompt": "p" * prompt})
    small, big = estimate_footprint(spec(1, 1)), estimate_footprint(spec(10_000, 60_000))
    assert big - small > 10_000 * 50 + 60_000


@pytest.mark.parametrize(("first", "again", "same"), [
    (("r1", "run-a"), ("r1", "run-a"), True),
    (("r1", "run-a"), ("r1", "run-b"), False),     # the key is (run_id, request_id): another run, another job
    (("r1", ""), ("r1", "run-a"), False),
    (("r1", "run-a"), ("r2", "run-a"), False),
])
def test_request_id_is_scoped_to_its_run(first, again, same):
    async def go():
        jm = JobManager("unittest")
        a = jm.submit("kind", _forever, request_id=first[0], run_id=first[1])
        b = jm.submit("kind", _forever, request_id=again[0], run_id=again[1])
        assert (a.job_id == b.job_id) is same
        assert jm.by_request(again[0], run_id=again[1]).job_id == b.job_id
        assert jm.by_request(first[0], run_id=first[1]).job_id == a.job_id
        assert jm.by_request(again[0], run_id="other-run") is None
        await jm.shutdown()
    run(go())


def test_an_evicted_request_id_is_pruned_and_a_retry_is_a_new_job():
    async def go():
        jm = JobManager("unittest", retain=3)
        forgotten: list[str] = []
        jm.on_evict.append(forgotten.append)          # a service's own per-job tables shrink with it
        first = jm.submit("kind", _ok, request_id="keep", run_id="r")
        await jm.wait(first.job_id, 5)
        for i in range(5):
            await jm.wait(jm.submit("kind", _ok, request_id=f"other-{i}", run_id="r").job_id, 5)
        jm.submit("kind", _ok)                        # evicts the oldest finished jobs
        with pytest.raises(errors.NotFound):
            jm.get(first.job_id)
        assert jm.by_request("keep", run_id="r") is None
        assert len(jm._by_request) <= 3              # entries leave with their jobs
        assert first.job_id in forgotten and all(j not in jm._jobs for j in forgotten)
        again = jm.submit("kind", _ok, request_id="keep", run_id="r")
        assert again.job_id != first.job_id and again.state == JobState.PENDING
        await jm.wait(again.job_id, 5)
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
