"""No client can exhaust a service with jobs (trace_common/jobs.py), over real gRPC against a real
rollout service process (`python -m services.rollout` on loopback, so its own RSS is measured).

The service runs one job at a time (TRACE_ROLLOUT_MAX_CONCURRENT_JOBS=1) and that slot is held by a
job whose policy calls an endpoint that accepts connections and never answers, so every other job
stays PENDING. Then: large specs (10,000 task ids and a 65,536-character system prompt, the caps of
trace_common/limits.py) are refused with RESOURCE_EXHAUSTED once the pending specs would pass
TRACE_ROLLOUT_MAX_PENDING_BYTES; cancelling them returns the service's RSS near where it started; a
request_id whose job was evicted (TRACE_ROLLOUT_RETAINED_JOBS) gets a new job when retried; a
request_id under another run_id is another request. Requests too large to be jobs at all (a 15 MiB
`environment.uri`, sent concurrently in rounds) are INVALID_ARGUMENT and leave the RSS near where it
was; Watch streams past their share of TRACE_ROLLOUT_MAX_CONCURRENT_RPCS are RESOURCE_EXHAUSTED while
unary calls and the health Check are still answered.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from trace_common import limits
from trace_common.grpc.client import messages
from trace_common.proto.trace.v1 import rollout_service_pb2_grpc as pb_grpc
from trace_common.proto.trace.v1 import types_pb2 as t

pytestmark = pytest.mark.integration
R = messages("rollout")
REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20
PENDING_BYTES = 32 * MIB
RETAINED = 5
#: After cancelling, the service's RSS is at most this far above its start, the RSS after a first,
#: warm-up flood (which leaves the server's own buffers and job table grown: measured cold 79-103 MiB,
#: after the warm-up 108); each flood of 154 pending jobs grows it by more than FLOOD_GROWTH (measured
#: 108 -> 143-144 MiB, and back to 108 after cancelling). Issue 28 measured, before: 40 jobs of a
#: 200k-character prompt and 100k task ids took the service from 514 to 767 MiB; cancelling, to 726.
RSS_BOUND = 8 * MIB
FLOOD_GROWTH = 24 * MIB
ROUNDS = 2
#: Calls in progress at once (TRACE_ROLLOUT_MAX_CONCURRENT_RPCS), and the concurrent refused requests
#: of one round below it, each with a `environment.uri` of HUGE_URI characters.
MAX_RPCS = 16
#: Streams that may be open at once: MAX_RPCS less the headroom kept for unary calls and health checks
#: (trace_common/grpc/interceptors.py STREAM_HEADROOM, at most half the cap).
MAX_STREAMS = 8
CONCURRENT_HUGE = 12
HUGE_URI = 15 * MIB
#: After rounds of huge refused requests the RSS is at most this far above its start (after a warm-up
#: round). Measured on 2 cores: start 120-128 MiB; a round of 12 holds 230-620 MiB while it runs and
#: leaves 0-24 MiB above the start 2 s later (8 rounds: 0-14 MiB, no drift). Before the fix (no field
#: cap, the refusal raised inside an except block, no GC/trim): 40 concurrent x 3 rounds took the service
#: from 73 MiB to 2 GiB and left 1.6 GiB. A fresh-clone CI run beside other work left 38, 20 and 15 MiB
#: above its start, hence 64 MiB: still 25x below what the unfixed service keeps.
HUGE_RSS_BOUND = 64 * MIB


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    hang = socket.socket()
    hang.bind(("127.0.0.1", 0))
    hang.listen(64)          # connections complete in the kernel's backlog; nobody ever answers
    root = tmp_path_factory.mktemp("flood")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACE_")}
    env.update(TRACE_ROLLOUT_ARTIFACT_ROOT=root.as_uri(), TRACE_ROLLOUT_MAX_CONCURRENT_JOBS="1",
               TRACE_ROLLOUT_MAX_PENDING_BYTES=str(PENDING_BYTES), TRACE_ROLLOUT_RETAINED_JOBS=str(RETAINED),
               TRACE_ROLLOUT_MAX_CONCURRENT_RPCS=str(MAX_RPCS),
               TRACE_ROLLOUT_ENDPOINTS=json.dumps({"hang": {"base_url": f"http://127.0.0.1:{hang.getsockname()[1]}/v1"}}))
    proc = subprocess.Popen([sys.executable, "-m", "services.rollout"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    deadline, lines = time.time() + 180, []
    while True:
        line = proc.stdout.readline()
        if "ready:" in line:
            break
        assert line or proc.poll() is None, "".join(lines)
        assert time.time() < deadline, "rollout service not ready after 180 s"
        lines.append(line)
    target = dict(p.split("=", 1) for p in line.split() if "=" in p)["grpc"]
    channel = grpc.insecure_channel(target, options=[("grpc.max_send_message_length", 16 * MIB)])
    stub = pb_grpc.RolloutServiceStub(channel)
    blocker = stub.CreateRolloutJob(R.CreateRolloutJobRequest(run_id="flood", spec=R.RolloutSpec(
        environment=t.EnvironmentRef(name="store"), max_turns=1, tasks=R.TaskSelection(task_ids=["1000000"]),
        policy=t.PolicyRef(backend=t.POLICY_BACKEND_OPENAI_HTTP, model="served", endpoint_profile="hang")))).job
    for _ in range(300):
        if stub.GetRolloutJob(R.GetRolloutJobRequest(job_id=blocker.job_id)).job.state == t.JOB_STATE_RUNNING:
            break
        time.sleep(0.1)
    try:
        stub.blocker_id = blocker.job_id
        stub.health = health_pb2_grpc.HealthStub(channel)
        yield stub, proc.pid
    finally:
        channel.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
            hang.close()


def _big(run_id: str = "flood", request_id: str = "") -> R.CreateRolloutJobRequest:
    return R.CreateRolloutJobRequest(run_id=run_id, request_id=request_id, spec=R.RolloutSpec(
        environment=t.EnvironmentRef(name="store"),
        policy=t.PolicyRef(backend=t.POLICY_BACKEND_SCRIPTED, model="expert"),
        tasks=R.TaskSelection(task_ids=[str(1_000_000 + i) for i in range(limits.TASK_IDS)]),
        system_prompt="p" * limits.PROMPT_CHARS))


def _small(run_id: str = "flood", request_id: str = "") -> R.CreateRolloutJobRequest:
    return R.CreateRolloutJobRequest(run_id=run_id, request_id=request_id, spec=R.RolloutSpec(
        environment=t.EnvironmentRef(name="store"), tasks=R.TaskSelection(task_ids=["1000001"]),
        policy=t.PolicyRef(backend=t.POLICY_BACKEND_SCRIPTED, model="expert")))


def _cancel_all_pending(stub) -> None:
    jobs = stub.ListRolloutJobs(R.ListRolloutJobsRequest(filter=t.JobFilter(states=[t.JOB_STATE_PENDING]),
                                                         page_size=1000)).jobs
    for job in jobs:
        stub.CancelRolloutJob(R.CancelRolloutJobRequest(job_id=job.job_id))


def _flood(stub) -> tuple[int, grpc.RpcError | None]:
    """Large jobs sent until one is refused: (how many were accepted, the refusal)."""
    for accepted in range(400):
        try:
            stub.CreateRolloutJob(_big())
        except grpc.RpcError as err:
            return accepted, err
    return 400, None


@pytest.mark.slow
def test_a_flood_of_large_pending_jobs_is_refused_and_cancelling_returns_the_memory(service):
    stub, pid = service
    cold = _rss(pid)
    _flood(stub)                     # a first flood warms the server (its buffers, the job table's size)
    _cancel_all_pending(stub)
    time.sleep(2.0)
    start, rounds = _rss(pid), []
    for _ in range(ROUNDS):
        accepted, refusal = _flood(stub)
        peak = _rss(pid)
        assert refusal is not None, f"{accepted} large jobs accepted, none refused"
        assert refusal.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refusal.details()
        details = refusal.details()
        assert "retry after some of them start or finish" in details and "TRACE_ROLLOUT_MAX_PENDING_BYTES" in details
        assert 1 <= accepted < 400
        with pytest.raises(grpc.RpcError) as again:               # still full: a second try is refused too
            stub.CreateRolloutJob(_big())
        assert again.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        _cancel_all_pending(stub)
        time.sleep(2.0)                                            # the trim runs 0.5 s after the cancels
        rounds.append((accepted, peak, _rss(pid)))
    print(f"rollout service RSS: cold {cold / MIB:.0f} MiB, start (after a warm-up flood) {start / MIB:.0f} MiB; per round (large pending jobs, RSS with them, after "
          f"cancelling): {[(n, round(p / MIB), round(a / MIB)) for n, p, a in rounds]} MiB")
    assert len({n for n, _, _ in rounds}) == 1                     # every round: the same room, given back
    for _, peak, after in rounds:
        assert peak - start > FLOOD_GROWTH, (start, rounds)        # the flood did hold memory
        assert after - start <= RSS_BOUND, (start, rounds)         # and cancelling gave it back
    small = stub.CreateRolloutJob(_small()).job                    # the room is back
    stub.CancelRolloutJob(R.CancelRolloutJobRequest(job_id=small.job_id))


def test_a_retried_request_id_whose_job_was_evicted_gets_a_new_job(service):
    stub, _ = service
    first = stub.CreateRolloutJob(_small(request_id="evicted-retry")).job
    assert stub.CreateRolloutJob(_small(request_id="evicted-retry")).job.job_id == first.job_id
    stub.CancelRolloutJob(R.CancelRolloutJobRequest(job_id=first.job_id))
    for _ in range(RETAINED + 2):                                  # finished jobs past the retained count
        job = stub.CreateRolloutJob(_small()).job
        stub.CancelRolloutJob(R.CancelRolloutJobRequest(job_id=job.job_id))
    with pytest.raises(grpc.RpcError) as gone:
        stub.GetRolloutJob(R.GetRolloutJobRequest(job_id=first.job_id))
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND
    retried = stub.CreateRolloutJob(_small(request_id="evicted-retry")).job
    assert retried.job_id != first.job_id and retried.state == t.JOB_STATE_PENDING
    stub.CancelRolloutJob(R.CancelRolloutJobRequest(job_id=retried.job_id))


@pytest.mark.parametrize(("first_run", "second_run", "same"), [("run-a", "run-a", True), ("run-a", "run-b", False),
                                                              ("", "run-b", False)])
def test_a_request_id_is_scoped_to_its_run(service, first_run, second_run, same):
    stub, _ = service
    rid = f"scoped-{first_run}-{second_run}"
    a = stub.CreateRolloutJob(_small(first_run, rid)).job
    b = stub.CreateRolloutJob(_small(second_run, rid)).job
    try:
        assert (a.job_id == b.job_id) is same
        assert b.run_id == second_run and a.run_id == first_run
    finally:
        _cancel_all_pending(stub)


@pytest.mark.parametrize(("change", "field", "cap"), [
    ({"system_prompt": "p" * (limits.PROMPT_CHARS + 1)}, "spec.system_prompt", limits.PROMPT_CHARS),
    ({"tasks": R.TaskSelection(task_ids=["1"] * (limits.TASK_IDS + 1))}, "spec.tasks.task_ids", limits.TASK_IDS),
])
def test_a_field_past_its_cap_is_invalid_argument_before_a_job(service, change, field, cap):
    stub, _ = service
    spec = _big().spec
    for name, value in change.items():
        if isinstance(value, str):
            setattr(spec, name, value)
        else:
            getattr(spec, name).CopyFrom(value)
    before = len(stub.ListRolloutJobs(R.ListRolloutJobsRequest(page_size=1000)).jobs)
    with pytest.raises(grpc.RpcError) as err:
        stub.CreateRolloutJob(R.CreateRolloutJobRequest(run_id="flood", spec=spec))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.details() and f"over the cap of {cap}" in err.value.details(), err.value.details()
    assert len(stub.ListRolloutJobs(R.ListRolloutJobsRequest(page_size=1000)).jobs) == before


def _huge_round(stub) -> dict[str, int]:
    """CONCURRENT_HUGE creates at once, each with a HUGE_URI-character environment.uri: codes -> count."""
    req = R.CreateRolloutJobRequest(run_id="flood", spec=R.RolloutSpec(
        environment=t.EnvironmentRef(name="store", uri="/" + "a" * HUGE_URI),
        policy=t.PolicyRef(backend=t.POLICY_BACKEND_SCRIPTED, model="expert")))
    codes: dict[str, int] = {}
    for call in [stub.CreateRolloutJob.future(req, timeout=120) for _ in range(CONCURRENT_HUGE)]:
        try:
            call.result()
            codes["OK"] = codes.get("OK", 0) + 1
        except grpc.RpcError as err:
            assert "spec.environment.uri" in err.details() and f"cap of {limits.URI_CHARS}" in err.details()
            codes[err.code().name] = codes.get(err.code().name, 0) + 1
    return codes


@pytest.mark.slow
def test_huge_refused_requests_give_their_memory_back(service):
    stub, pid = service
    _huge_round(stub)                                          # warm-up: the server's buffers grow once
    time.sleep(2.0)
    start, rounds = _rss(pid), []
    for _ in range(3):
        codes = _huge_round(stub)
        peak = _rss(pid)
        # The trim runs 0.2 s after the calls end; on a loaded machine (CI beside other work) the server
        # may still be finishing the refused calls then, so wait for the RSS to settle, up to 30 s. Without
        # the trim it never does: the 1.6 GiB stayed for minutes.
        deadline = time.monotonic() + 30
        while _rss(pid) - start > HUGE_RSS_BOUND and time.monotonic() < deadline:
            time.sleep(0.5)
        rounds.append((codes, peak, _rss(pid)))
    print(f"rollout service RSS after huge refused requests: start {start / MIB:.0f} MiB; per round (codes, "
          f"RSS at the end of the round, once settled): {[(c, round(p / MIB), round(a / MIB)) for c, p, a in rounds]}")
    for codes, _, after in rounds:
        assert codes == {"INVALID_ARGUMENT": CONCURRENT_HUGE}, codes
        assert after - start <= HUGE_RSS_BOUND, (start, rounds)


def _watch_code(stream) -> str:
    try:
        next(stream)
        return "OK"
    except grpc.RpcError as err:
        assert "TRACE_ROLLOUT_MAX_CONCURRENT_RPCS" in err.details(), err.details()
        return err.code().name


def test_streams_past_their_share_of_the_concurrency_cap_are_resource_exhausted(service):
    stub, _ = service
    watch = R.WatchRolloutJobRequest(job_id=stub.blocker_id)
    streams = [stub.WatchRolloutJob(watch) for _ in range(MAX_RPCS)]
    try:
        codes = Counter(_watch_code(s) for s in streams)       # each answered stream stays open on the server
        assert codes == {"OK": MAX_STREAMS, "RESOURCE_EXHAUSTED": MAX_RPCS - MAX_STREAMS}, codes
        assert stub.ListRolloutJobs(R.ListRolloutJobsRequest(page_size=1)).jobs   # unary calls keep their room
        assert stub.health.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING
    finally:
        for s in streams:
            s.cancel()
    for _ in range(50):                                        # the cancelled streams end on the server
        again = stub.WatchRolloutJob(watch)
        try:
            if _watch_code(again) == "OK":
                break
        finally:
            again.cancel()
        time.sleep(0.1)
    else:
        raise AssertionError("streams still refused after the open ones were cancelled")
