"""What one rollout request can make the service hold, and what a job leaves behind, over real gRPC
(one rollout server on loopback with its own store, configured as an operator would).

A review found that one request could run the service out of memory (10,000 task ids x 1024 samples:
every episode's task created up front, every trajectory held to the end); that an episode that raised
failed the job while the others kept playing after its slot was freed; that only an explicit
`output_uri` was claimed, so a second request naming a live job's default prefix wrote over its
objects; and that the store listing behind that check blocked the event loop. Here: a job past
TRACE_ROLLOUT_MAX_EPISODES_PER_JOB is INVALID_ARGUMENT naming the fields and the setting; a job plays on
`concurrency` worker tasks and publishes in task order; a failing episode ends every other one before
the job ends; every live job's prefix (and any prefix inside or above it) is refused; the store is
listed off the loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from services.rollout.metrics import M
from trace_common.artifacts import open_uri
from trace_common.env import loads_jsonl
from trace_common.grpc.client import Endpoint, messages, open_channel, stub
from trace_common.proto.trace.v1 import types_pb2 as t

pytestmark = pytest.mark.integration
R = messages("rollout")
#: The server's cap on episodes per job (TRACE_ROLLOUT_MAX_EPISODES_PER_JOB).
CAP = 200
TEST_SEEDS = range(1_000_000, 1_000_600)  # the store's test split


class RolloutServer:
    """One rollout service as a real gRPC server on loopback, on its own event loop thread."""

    def __init__(self, root: Path, **settings):
        from services.launch import build
        from trace_common.grpc.server import TraceServer

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.settings, definition = build("rollout", host="127.0.0.1", port=0, metrics_port=0,
                                          artifact_root=root.resolve().as_uri(), **settings)
        self.domain = definition.domain
        self.server = TraceServer(self.settings, definition, warn_without_auth=False)
        self.call(self.server.start())
        self.channel = open_channel(Endpoint(self.server.target))
        self.stub = stub("rollout", self.channel)

    def call(self, coro, timeout: float = 120):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.channel.close()
        self.call(self.server.stop(1.0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def rollout(tmp_path_factory):
    server = RolloutServer(tmp_path_factory.mktemp("rollout-bounds"), max_episodes_per_job=CAP)
    yield server
    server.close()


def _spec(model: str = "expert:perfect", tasks: R.TaskSelection | None = None, **kw) -> R.RolloutSpec:
    return R.RolloutSpec(environment=t.EnvironmentRef(name="store"),
                         policy=t.PolicyRef(backend=t.POLICY_BACKEND_SCRIPTED, model=model),
                         tasks=tasks or R.TaskSelection(split="test", limit=2), **kw)


def _create(rollout: RolloutServer, spec: R.RolloutSpec, run_id: str = "bounds"):
    return rollout.stub.CreateRolloutJob(R.CreateRolloutJobRequest(spec=spec, run_id=run_id,
                                                                   request_id=uuid.uuid4().hex), timeout=60).job


def _wait(rollout: RolloutServer, job_id: str, timeout: float = 120):
    last = None
    for msg in rollout.stub.WatchRolloutJob(R.WatchRolloutJobRequest(job_id=job_id), timeout=timeout):
        last = msg.job
    return last


def _cancel(rollout: RolloutServer, job_id: str) -> None:
    rollout.stub.CancelRolloutJob(R.CancelRolloutJobRequest(job_id=job_id), timeout=30)
    _wait(rollout, job_id)


def _ids(n: int) -> list[str]:
    return [str(s) for s in TEST_SEEDS[:n]]


# -- the cap on episodes per job --------------------------------------------------------------------

@pytest.mark.parametrize(("tasks", "samples", "fields", "episodes"), [
    (R.TaskSelection(task_ids=_ids(150)), 2, "spec.tasks.task_ids x spec.samples_per_task", 300),
    (R.TaskSelection(split="test", limit=CAP + 1), 0, "spec.tasks.limit x spec.samples_per_task", CAP + 1),
    (R.TaskSelection(split="dev"), 1, "spec.tasks.split x spec.samples_per_task", 300),  # the whole split
    (R.TaskSelection(split="train", limit=100_000), 1, "spec.tasks.limit x spec.samples_per_task", 100_000),
    (R.TaskSelection(task_ids=[str(i) for i in range(10_000)]), 1024,  # the review's request: 10.24M episodes
     "spec.tasks.task_ids x spec.samples_per_task", 10_240_000),
], ids=["task-ids-x-samples", "split-limit", "whole-split", "train-100k", "10k-ids-x-1024"])
def test_a_job_past_the_episode_cap_is_refused(rollout, tasks, samples, fields, episodes):
    with pytest.raises(grpc.RpcError) as err:
        _create(rollout, _spec(tasks=tasks, samples_per_task=samples))
    details = err.value.details()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, details
    for fragment in (fields, f"at most {CAP} episodes per job", f"got {episodes}",
                     "TRACE_ROLLOUT_MAX_EPISODES_PER_JOB", "Split the tasks over several jobs"):
        assert fragment in details, details
    assert rollout.stub.ListRolloutJobs(R.ListRolloutJobsRequest(), timeout=30).jobs is not None  # still serving


def test_a_job_at_the_episode_cap_is_accepted(rollout):
    job = _create(rollout, _spec(tasks=R.TaskSelection(split="test", limit=CAP // 2), samples_per_task=2,
                                 max_turns=1))
    assert _wait(rollout, job.job_id).state == t.JOB_STATE_SUCCEEDED


# -- bounded work, same order -------------------------------------------------------------------------

def test_a_job_plays_on_concurrency_workers_and_keeps_task_order(rollout):
    """120 episodes at concurrency 3: the server's loop never holds more than a few tasks beyond its
    idle count (it held one task per episode before), and the file lists (task, sample) in request order."""
    seeds = [int(s) for s in _ids(60)][::-1]  # a non-sorted order: the published order is the request's
    stop = asyncio.Event()

    async def peak_tasks() -> tuple[int, int]:
        idle = peak = len(asyncio.all_tasks())
        while not stop.is_set():
            peak = max(peak, len(asyncio.all_tasks()))
            await asyncio.sleep(0.002)
        return idle, peak

    sampler = asyncio.run_coroutine_threadsafe(peak_tasks(), rollout.loop)
    time.sleep(0.1)
    try:
        job = _create(rollout, _spec("expert:perfect@2ms", R.TaskSelection(task_ids=[str(s) for s in seeds]),
                                     samples_per_task=2, concurrency=3))
        final = _wait(rollout, job.job_id)
    finally:
        rollout.loop.call_soon_threadsafe(stop.set)
    idle, peak = sampler.result(30)
    assert final.state == t.JOB_STATE_SUCCEEDED, final.error.message
    # 3 workers + the job's task, the Create and Watch handlers, and room for a stray gRPC task or two
    assert peak - idle <= 3 + 6, (idle, peak)
    store, key = open_uri(next(o.uri for o in final.outputs if o.kind == "trajectories"))
    trajs = loads_jsonl(store.get_bytes(key))
    assert [(int(tr.task_id), tr.sample_index) for tr in trajs] == [(s, k) for s in seeds for k in (0, 1)]


# -- a failing episode ends the others ------------------------------------------------------------------

def test_an_episode_that_raises_cancels_the_others_before_the_job_ends(rollout, monkeypatch):
    from trace_common.domains.store.env import StoreEnv

    bad = TEST_SEEDS[1]
    resets: list[int] = []
    reset = StoreEnv.reset

    def failing_reset(self, seed):
        resets.append(seed)
        if seed == bad:
            raise RuntimeError(f"reset failed for seed {seed}")
        return reset(self, seed)

    monkeypatch.setattr(StoreEnv, "reset", failing_reset)
    job = _create(rollout, _spec("expert:perfect@20ms", R.TaskSelection(split="test", limit=60), concurrency=4))
    final = _wait(rollout, job.job_id)
    assert final.state == t.JOB_STATE_FAILED and f"reset failed for seed {bad}" in final.error.message
    ended = len(resets)
    time.sleep(1.0)  # episodes the job left running would go on resetting new ones (and playing turns)
    assert len(resets) == ended < 60, (ended, len(resets))
    assert M.registry.get_sample_value("trace_rollout_episodes_active") == 0  # none in play
    assert rollout.stub.ListRolloutJobs(R.ListRolloutJobsRequest(), timeout=30).jobs  # the service still serves


# -- output prefixes of live jobs ---------------------------------------------------------------------

@pytest.mark.parametrize(("live_output", "requested"), [
    ("", "{live}"),                                       # a live job's default prefix
    ("", "{live}/part"),                                  # inside it
    ("named-{u}/a", "{live}"),                            # a live job's named prefix
    ("named-{u}/a", "runs/mine/rollouts/named-{u}"),      # above it
    ("named-{u}", "{live}/a/b"),                          # inside it
], ids=["default", "inside-default", "named", "above-named", "inside-named"])
def test_a_prefix_a_live_job_writes_is_refused(rollout, live_output, requested):
    store, u = rollout.domain.store, uuid.uuid4().hex[:8]
    live_spec = _spec("expert:perfect@50ms", R.TaskSelection(split="test", limit=100), concurrency=1,
                      output_uri=store.uri_for(f"runs/mine/rollouts/{live_output.format(u=u)}") if live_output else "")
    live = _create(rollout, live_spec, "mine")
    try:
        prefix = (f"runs/mine/rollouts/{live_output.format(u=u)}" if live_output
                  else f"runs/mine/rollouts/{live.job_id}")
        with pytest.raises(grpc.RpcError) as err:
            _create(rollout, _spec(output_uri=store.uri_for(requested.format(live=prefix, u=u))), "mine")
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS, err.value.details()
        assert "spec.output_uri" in err.value.details() and "live rollout job" in err.value.details()
    finally:
        _cancel(rollout, live.job_id)


def test_a_prefix_is_free_again_when_its_job_ends_without_writing(rollout):
    live = _create(rollout, _spec("expert:perfect@50ms", R.TaskSelection(split="test", limit=100), concurrency=1),
                   "mine")
    _cancel(rollout, live.job_id)  # (a cancelled job publishes nothing)
    job = _create(rollout, _spec(output_uri=rollout.domain.store.uri_for(f"runs/mine/rollouts/{live.job_id}"),
                                 max_turns=1), "mine")
    assert _wait(rollout, job.job_id).state == t.JOB_STATE_SUCCEEDED


# -- the store listing runs off the event loop ------------------------------------------------------

def _slow_listing(store, monkeypatch) -> tuple[threading.Event, threading.Event]:
    """(listing, release): the store's list() sets `listing` and answers only once `release` is set."""
    listing, release = threading.Event(), threading.Event()
    real_list = store.list

    def slow_list(prefix: str = ""):
        listing.set()
        release.wait(20)
        return real_list(prefix)

    monkeypatch.setattr(store, "list", slow_list)
    return listing, release


def test_the_store_is_listed_off_the_event_loop(rollout, monkeypatch):
    """While the store takes its time to list a requested prefix, the service answers other calls, and a
    second request naming the same prefix is refused (the first one is checking it)."""
    store = rollout.domain.store
    listing, release = _slow_listing(store, monkeypatch)
    uri = store.uri_for(f"runs/mine/rollouts/slow-{uuid.uuid4().hex[:8]}")
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(_create, rollout, _spec(output_uri=uri, max_turns=1), "mine")
        try:
            assert listing.wait(30)
            rollout.stub.ListRolloutJobs(R.ListRolloutJobsRequest(), timeout=3)  # the loop is free
            with pytest.raises(grpc.RpcError) as err:
                _create(rollout, _spec(output_uri=uri), "mine")
            assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS, err.value.details()
        finally:
            release.set()
        job = first.result(30)
    assert _wait(rollout, job.job_id).state == t.JOB_STATE_SUCCEEDED


def test_a_retry_while_its_request_checks_the_store_gets_the_same_job(rollout, monkeypatch):
    """A client that retries its create (same request_id) while the first attempt is still checking its
    output prefix against the store gets the first attempt's job, as any retry does (it used to be
    refused ALREADY_EXISTS: the prefix was being checked, by itself)."""
    store = rollout.domain.store
    listing, release = _slow_listing(store, monkeypatch)
    request = R.CreateRolloutJobRequest(
        spec=_spec(output_uri=store.uri_for(f"runs/mine/rollouts/retry-{uuid.uuid4().hex[:8]}"), max_turns=1),
        run_id="mine", request_id=uuid.uuid4().hex)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(lambda: rollout.stub.CreateRolloutJob(request, timeout=60).job)
        assert listing.wait(30)
        retry = pool.submit(lambda: rollout.stub.CreateRolloutJob(request, timeout=60).job)
        time.sleep(0.5)  # the retry reaches the service while the first still lists
        assert not retry.done()
        release.set()
        jobs = first.result(30), retry.result(30)
    assert jobs[0].job_id == jobs[1].job_id
    assert _wait(rollout, jobs[0].job_id).state == t.JOB_STATE_SUCCEEDED
