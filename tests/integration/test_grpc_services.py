"""The five services as real gRPC servers: health (Check and Watch), reflection, auth, limits,
jobs over the wire, graceful stop, and the tracectl commands that use them."""

import asyncio
import os
import signal
import subprocess
import sys
import time

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.support.stack import TOKEN
from trace_common.config import SERVICE_NAMES
from trace_common.grpc.client import SERVICES, Endpoint, messages, open_channel
from trace_common.jobs import Output
from trace_common.proto.trace.v1 import types_pb2 as t

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("service", SERVICE_NAMES)
def test_health_and_reflection(embedded_stack, service):
    with open_channel(Endpoint(embedded_stack.targets[service])) as ch:
        h = health_pb2_grpc.HealthStub(ch)
        for name in ("", SERVICES[service][3]):
            assert h.Check(health_pb2.HealthCheckRequest(service=name)).status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)
        resp = next(iter(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))))
        names = {s.name for s in resp.list_services_response.service}
        assert {SERVICES[service][3], "grpc.health.v1.Health"} <= names


@pytest.mark.parametrize("stack", ["embedded_stack", "authed_stack"])
@pytest.mark.parametrize("service", SERVICE_NAMES)
def test_health_watch_streams_serving(request, stack, service):
    """grpc.health.v1 Watch (a coroutine that writes for itself, unlike the servicers' async
    generators) through every interceptor; where auth is on it needs the token (a stream held open
    takes a slot of max_concurrent_rpcs: tests/integration/test_grpc_stream_cap.py)."""
    s = request.getfixturevalue(stack)
    md = (("authorization", f"Bearer {TOKEN}"),) if stack == "authed_stack" else ()
    with open_channel(Endpoint(s.targets[service])) as ch:
        h = health_pb2_grpc.HealthStub(ch)
        if md:
            with pytest.raises(grpc.RpcError) as info:
                next(h.Watch(health_pb2.HealthCheckRequest(), timeout=10))
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        for name in ("", SERVICES[service][3]):
            call = h.Watch(health_pb2.HealthCheckRequest(service=name), metadata=md, timeout=10)
            try:
                first = next(call)
            finally:
                call.cancel()
            assert first.status == health_pb2.HealthCheckResponse.SERVING, name
        # the server is fine after two cancelled watches
        assert h.Check(health_pb2.HealthCheckRequest(), timeout=5).status == health_pb2.HealthCheckResponse.SERVING


def test_health_watch_of_an_unknown_service_streams_service_unknown(embedded_stack):
    with open_channel(Endpoint(embedded_stack.targets["trainer"])) as ch:
        call = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service="no.such.Service"),
                                                   timeout=10)
        try:
            assert next(call).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        finally:
            call.cancel()


def _rpc_count(stack, service: str, method: str, code: str) -> float:
    # the token only matters to the authed stack's /metrics; the open one ignores the header
    text = httpx.get(stack.metrics_urls[service], headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5).text
    prefix = f'trace_{service}_rpc_requests_total{{code="{code}",method="{method}"}}'
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(prefix))


def test_stream_request_handlers_pass_every_interceptor(authed_stack):
    """Reflection (stream-stream) where auth is on: UNAUTHENTICATED without the token; with it
    answered, counted; undecodable bytes in its request stream are INVALID_ARGUMENT like on any
    unary method."""
    before = _rpc_count(authed_stack, "environment", "ServerReflectionInfo", "OK")
    md = (("authorization", f"Bearer {TOKEN}"),)
    question = reflection_pb2.ServerReflectionRequest(list_services="")
    with open_channel(Endpoint(authed_stack.targets["environment"])) as ch:
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)
        with pytest.raises(grpc.RpcError) as anonymous:
            list(refl.ServerReflectionInfo(iter([question]), timeout=10))
        assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
        resp = list(refl.ServerReflectionInfo(iter([question]), metadata=md, timeout=10))
        assert "trace.v1.EnvironmentService" in {x.name for x in resp[0].list_services_response.service}
        raw = ch.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
        with pytest.raises(grpc.RpcError) as info:
            list(raw(iter([b"\x0a\x7f"]), metadata=md, timeout=10))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ServerReflectionInfo: the request bytes do not decode" in info.value.details()
    assert _rpc_count(authed_stack, "environment", "ServerReflectionInfo", "OK") == before + 1
    assert _rpc_count(authed_stack, "environment", "ServerReflectionInfo", "INVALID_ARGUMENT") >= 1


@pytest.mark.parametrize("service", SERVICE_NAMES)
@pytest.mark.parametrize(("token", "fragment"), [(None, "missing"), ("wrong-token", "invalid bearer token")])
def test_auth_required_except_health(authed_stack, service, token, fragment):
    pb2 = messages(service)
    list_call = {"rollout": ("ListRolloutJobs", pb2.__dict__.get("ListRolloutJobsRequest")),
                 "analysis": ("ListAnalysisJobs", pb2.__dict__.get("ListAnalysisJobsRequest")),
                 "environment": ("ListEnvironments", pb2.__dict__.get("ListEnvironmentsRequest")),
                 "trainer": ("ListTrainingJobs", pb2.__dict__.get("ListTrainingJobsRequest")),
                 "inference": ("ListCompositions", pb2.__dict__.get("ListCompositionsRequest"))}[service]
    with pytest.raises(grpc.RpcError) as info:
        getattr(authed_stack.stub(service, token=token), list_call[0])(list_call[1](), timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert fragment in info.value.details()
    # with the right token the same call works; the health Check needs no token (Kubernetes probes)
    getattr(authed_stack.stub(service), list_call[0])(list_call[1](), timeout=5)
    with open_channel(Endpoint(authed_stack.targets[service])) as ch:
        assert health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest()).status == 1


def test_streaming_call_without_token_is_unauthenticated(authed_stack):
    R = messages("rollout")
    with pytest.raises(grpc.RpcError) as info:
        list(authed_stack.stub("rollout", token=None).WatchRolloutJob(R.WatchRolloutJobRequest(job_id="x"), timeout=5))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_oversized_request_is_resource_exhausted_and_server_survives(authed_stack):
    R = messages("rollout")
    big = R.CreateRolloutJobRequest(labels={"blob": "x" * (2 << 20)})  # 2 MiB > the 1 MiB limit
    with pytest.raises(grpc.RpcError) as info:
        authed_stack.stub("rollout").CreateRolloutJob(big, timeout=10)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert authed_stack.stub("rollout").ListRolloutJobs(R.ListRolloutJobsRequest(), timeout=5) is not None


def _submit(stack, service, body, **kw):
    async def go():
        return stack.domain(service).jobs.submit("probe", body, **kw)
    return stack.call(go())


def test_job_progress_streams_over_watch_and_get(embedded_stack):
    """A job body running inside the trainer service, observed only through gRPC."""
    release = asyncio.Event()

    async def body(ctx):
        for i in range(1, 4):
            ctx.progress(completed=i, total=3, stage="iterating")
            ctx.set_metrics({"reward_mean": i / 3})
            await asyncio.sleep(0.05)
        await release.wait()
        ctx.add_output(Output("file:///tmp/adapter", "0" * 64, 10, "adapter"))
        return None

    rec = _submit(embedded_stack, "trainer", body, run_id="run-1", labels={"capability": "x"})
    T = messages("trainer")
    stub = embedded_stack.stub("trainer")
    seen = []
    for msg in stub.WatchTrainingJob(T.WatchTrainingJobRequest(job_id=rec.job_id), timeout=30):
        seen.append(msg.job)
        if msg.job.progress.completed == 3 and not release.is_set():
            embedded_stack.loop.call_soon_threadsafe(release.set)
    assert seen[-1].state == t.JOB_STATE_SUCCEEDED
    assert [j.progress.completed for j in seen if j.state == t.JOB_STATE_RUNNING][-1] == 3
    got = stub.GetTrainingJob(T.GetTrainingJobRequest(job_id=rec.job_id)).job
    assert got.outputs[0].kind == "adapter" and got.metrics["reward_mean"] == pytest.approx(1.0)
    assert got.run_id == "run-1" and got.labels["capability"] == "x"
    assert got.end_time.seconds >= got.start_time.seconds >= got.create_time.seconds > 0
    listed = stub.ListTrainingJobs(T.ListTrainingJobsRequest(filter=t.JobFilter(run_id="run-1"))).jobs
    assert [j.job_id for j in listed] == [rec.job_id]


def test_cancel_over_grpc(embedded_stack):
    async def body(ctx):
        await asyncio.sleep(3600)

    rec = _submit(embedded_stack, "analysis", body)
    A = messages("analysis")
    stub = embedded_stack.stub("analysis")
    deadline = time.time() + 5
    while stub.GetAnalysisJob(A.GetAnalysisJobRequest(job_id=rec.job_id)).job.state != t.JOB_STATE_RUNNING:
        assert time.time() < deadline
        time.sleep(0.02)
    stub.CancelAnalysisJob(A.CancelAnalysisJobRequest(job_id=rec.job_id))
    states = [m.job.state for m in stub.WatchAnalysisJob(A.WatchAnalysisJobRequest(job_id=rec.job_id), timeout=10)]
    assert states[-1] == t.JOB_STATE_CANCELLED
    with pytest.raises(grpc.RpcError) as info:  # cancelling again is fine; cancelling a finished job is not
        ok = _submit(embedded_stack, "analysis", _noop)
        embedded_stack.call(embedded_stack.domain("analysis").jobs.wait(ok.job_id, 5))
        stub.CancelAnalysisJob(A.CancelAnalysisJobRequest(job_id=ok.job_id))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def _noop(ctx):
    return None


@pytest.mark.parametrize(("service", "method", "request_name", "listed"), [
    ("rollout", "ListRolloutEnvironments", "ListRolloutEnvironmentsRequest",
     lambda r: "store" in {e.name for e in r.environments}),
    ("environment", "ListEnvironments", "ListEnvironmentsRequest", lambda r: all(e.name for e in r.environments)),
    ("inference", "ListCompositions", "ListCompositionsRequest", lambda r: all(c.spec.name for c in r.compositions)),
    ("environment", "ListGenerationJobs", "ListGenerationJobsRequest", lambda r: all(j.job_id for j in r.jobs)),
])
def test_list_calls_answer(embedded_stack, service, method, request_name, listed):
    """Each list call answers with its own response message, every listed item named (the built-in
    store among the rollout service's environments)."""
    resp = getattr(embedded_stack.stub(service), method)(getattr(messages(service), request_name)(), timeout=5)
    assert type(resp).__name__ == request_name.replace("Request", "Response")
    assert listed(resp)
    assert resp.IsInitialized()


def test_rpc_metrics_count_codes(embedded_stack):
    R = messages("rollout")
    with pytest.raises(grpc.RpcError):
        embedded_stack.stub("rollout").GetRolloutJob(R.GetRolloutJobRequest(job_id="metric-probe"))
    text = httpx.get(embedded_stack.metrics_urls["rollout"], timeout=5).text
    line = next(ln for ln in text.splitlines()
                if ln.startswith('trace_rollout_rpc_requests_total{code="NOT_FOUND",method="GetRolloutJob"}'))
    assert float(line.rsplit(" ", 1)[1]) >= 1
    assert 'trace_build_info{python=' in text and 'service="rollout"' in text


@pytest.mark.parametrize("service", ["rollout", "inference"])
def test_service_process_stops_gracefully_on_sigterm(tmp_path, service):
    env = {**os.environ, f"TRACE_{service.upper()}_ARTIFACT_ROOT": tmp_path.as_uri()}
    proc = subprocess.Popen([sys.executable, "-m", f"services.{service}"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    try:
        line = ""
        deadline = time.time() + 60
        while "ready:" not in line:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "service exited before becoming ready"
            assert time.time() < deadline
        target = line.split("grpc=")[1].split()[0]
        with open_channel(Endpoint(target)) as ch:
            assert health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest()).status == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_service_process_rejects_bad_settings(tmp_path):
    env = {**os.environ, "TRACE_TRAINER_ARTIFACT_ROOT": "s3://bucket"}
    out = subprocess.run([sys.executable, "-m", "services.trainer"], capture_output=True, text=True, env=env,
                         timeout=60)
    assert out.returncode == 2
    assert "TRACE_TRAINER_S3_ENDPOINT" in out.stderr and "Traceback" not in out.stderr


def test_tracectl_up_once_and_status(tmp_path, embedded_stack):
    exe = [sys.executable, "-m", "tracectl"]
    up = subprocess.run([*exe, "up", "--once", "--root", str(tmp_path / "s")], capture_output=True, text=True,
                        timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    assert up.stdout.count("SERVING") == 5 and "all five services healthy" in up.stdout
    targets = [f"--target={k}={v}" for k, v in embedded_stack.targets.items()]
    st = subprocess.run([*exe, "status", *targets], capture_output=True, text=True, timeout=60)
    assert st.returncode == 0 and st.stdout.count("SERVING") == 5
    down = subprocess.run([*exe, "status", "--target", "rollout=127.0.0.1:1"], capture_output=True, text=True,
                          timeout=60)
    assert down.returncode == 1 and "UNAVAILABLE" in down.stdout
    missing = subprocess.run([*exe, "status", "--root", str(tmp_path / "none")], capture_output=True, text=True,
                             timeout=60)
    assert missing.returncode == 1 and "tracectl up" in missing.stderr


def test_token_from_env_for_tracectl_status(authed_stack):
    targets = [f"--target={k}={v}" for k, v in authed_stack.targets.items()]
    st = subprocess.run([sys.executable, "-m", "tracectl", "status", *targets], capture_output=True, text=True,
                        timeout=60, env={**os.environ, "TRACE_AUTH_TOKEN": TOKEN})
    assert st.returncode == 0, st.stdout


def test_tracectl_help_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "tracectl", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for cmd in ("up", "status", "rollout", "analyze", "envs", "run", "report", "serve", "tau2"):
        assert cmd in out.stdout
