"""Bad input against every RPC of every service, over real gRPC on loopback.

Each case: the documented status code, a message naming the problem, the server still
healthy afterwards, and nothing written to the artifact store. Below the per-RPC table: request
bytes that decode as no message (INVALID_ARGUMENT with one fixed message naming the method, on
every method, health included) and 70 KB values in id / name fields (the status detail stays
bounded instead of echoing the value until it passes gRPC's metadata limit).
"""

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from trace_common.grpc.client import SERVICES, Endpoint, messages, open_channel
from trace_common.proto.trace.v1 import types_pb2 as t

pytestmark = pytest.mark.integration

R, A, E, T, INF = (messages(s) for s in ("rollout", "analysis", "environment", "trainer", "inference"))
GOOD_POLICY = t.PolicyRef(backend=t.POLICY_BACKEND_IN_PROCESS, model="micro")
GOOD_ENV = t.EnvironmentRef(name="store")


def _struct(**values):
    from google.protobuf.struct_pb2 import Struct

    s = Struct()
    s.update(values)
    return s

# (service, method, request, code, message fragment)
CASES = [
    # rollout
    ("rollout", "CreateRolloutJob", R.CreateRolloutJobRequest(), "INVALID_ARGUMENT", "spec.environment"),
    ("rollout", "CreateRolloutJob", R.CreateRolloutJobRequest(spec=R.RolloutSpec(
        environment=t.EnvironmentRef(name="Bad Name!"), policy=GOOD_POLICY)), "INVALID_ARGUMENT", "environment name"),
    ("rollout", "CreateRolloutJob", R.CreateRolloutJobRequest(spec=R.RolloutSpec(
        environment=GOOD_ENV, policy=t.PolicyRef(model="m"))), "INVALID_ARGUMENT", "spec.policy.backend"),
    ("rollout", "CreateRolloutJob", R.CreateRolloutJobRequest(spec=R.RolloutSpec(
        environment=GOOD_ENV, policy=GOOD_POLICY, output_uri="ftp://x/y")), "INVALID_ARGUMENT", "output_uri"),
    ("rollout", "CreateRolloutJob", R.CreateRolloutJobRequest(spec=R.RolloutSpec(
        environment=GOOD_ENV, policy=GOOD_POLICY, samples_per_task=-3)), "INVALID_ARGUMENT", "samples_per_task"),
    ("rollout", "CreateRolloutJob", R.CreateRolloutJobRequest(spec=R.RolloutSpec(
        environment=GOOD_ENV, policy=t.PolicyRef(backend=2, model="m", endpoint="not a url"))),
     "INVALID_ARGUMENT", "policy.endpoint"),
    ("rollout", "CreateRolloutJob", R.CreateRolloutJobRequest(spec=R.RolloutSpec(
        environment=GOOD_ENV, policy=GOOD_POLICY, tasks=R.TaskSelection(limit=-1))), "INVALID_ARGUMENT",
     "spec.tasks.limit"),
    ("rollout", "CreateRolloutJob", R.CreateRolloutJobRequest(spec=R.RolloutSpec(
        environment=t.EnvironmentRef(name="ghost"), policy=GOOD_POLICY)), "NOT_FOUND", "ghost"),
    ("rollout", "GetRolloutJob", R.GetRolloutJobRequest(), "INVALID_ARGUMENT", "job_id"),
    ("rollout", "GetRolloutJob", R.GetRolloutJobRequest(job_id="nope"), "NOT_FOUND", "nope"),
    ("rollout", "CancelRolloutJob", R.CancelRolloutJobRequest(job_id="nope"), "NOT_FOUND", "nope"),
    ("rollout", "ListRolloutJobs", R.ListRolloutJobsRequest(page_size=-1), "INVALID_ARGUMENT", "page_size"),
    ("rollout", "ListRolloutJobs", R.ListRolloutJobsRequest(page_token="garbage!"), "INVALID_ARGUMENT", "page_token"),
    ("rollout", "ListRolloutJobs", R.ListRolloutJobsRequest(filter=t.JobFilter(states=[42])), "INVALID_ARGUMENT",
     "filter.states"),
    # analysis
    ("analysis", "CreateAnalysisJob", A.CreateAnalysisJobRequest(), "INVALID_ARGUMENT", "spec.rollout_uris"),
    ("analysis", "CreateAnalysisJob", A.CreateAnalysisJobRequest(spec=A.AnalysisSpec(
        rollout_uris=["relative/path"], mode=A.ANALYST_MODE_DIAGNOSTICS)), "INVALID_ARGUMENT", "not a URI"),
    ("analysis", "CreateAnalysisJob", A.CreateAnalysisJobRequest(spec=A.AnalysisSpec(
        rollout_uris=["s3:///nobucket"], mode=A.ANALYST_MODE_DIAGNOSTICS)), "INVALID_ARGUMENT", "no bucket"),
    ("analysis", "CreateAnalysisJob", A.CreateAnalysisJobRequest(spec=A.AnalysisSpec(
        rollout_uris=["file:///r.jsonl"], mode=A.ANALYST_MODE_LLM)), "INVALID_ARGUMENT", "needs llm"),
    ("analysis", "CreateAnalysisJob", A.CreateAnalysisJobRequest(spec=A.AnalysisSpec(
        rollout_uris=["file:///r.jsonl"], mode=A.ANALYST_MODE_DIAGNOSTICS, num_runs=5, min_passing_runs=8)),
     "INVALID_ARGUMENT", "min_passing_runs"),
    ("analysis", "CreateAnalysisJob", A.CreateAnalysisJobRequest(spec=A.AnalysisSpec(
        rollout_uris=["file:///r.jsonl"], mode=A.ANALYST_MODE_DIAGNOSTICS), run_id="bad run"),
     "INVALID_ARGUMENT", "run_id"),
    ("analysis", "CreateAnalysisJob", A.CreateAnalysisJobRequest(spec=A.AnalysisSpec(
        rollout_uris=["file:///r.jsonl"], mode=A.ANALYST_MODE_DIAGNOSTICS), labels={"Bad": "x"}),
     "INVALID_ARGUMENT", "labels"),
    ("analysis", "GetAnalysisJob", A.GetAnalysisJobRequest(job_id="nope"), "NOT_FOUND", "nope"),
    ("analysis", "CancelAnalysisJob", A.CancelAnalysisJobRequest(job_id="nope"), "NOT_FOUND", "nope"),
    ("analysis", "ListAnalysisJobs", A.ListAnalysisJobsRequest(page_size=100000), "INVALID_ARGUMENT", "page_size"),
    # environment
    ("environment", "CreateGenerationJob", E.CreateGenerationJobRequest(), "INVALID_ARGUMENT", "spec.capabilities"),
    ("environment", "CreateGenerationJob", E.CreateGenerationJobRequest(spec=E.GenerationSpec(
        capabilities=[t.Capability(name="NotSnake")], target=GOOD_ENV, mode=E.GENERATION_MODE_LIBRARY)),
     "INVALID_ARGUMENT", "snake_case"),
    ("environment", "CreateGenerationJob", E.CreateGenerationJobRequest(spec=E.GenerationSpec(
        capabilities=[t.Capability(name="a_b"), t.Capability(name="a_b")], target=GOOD_ENV,
        mode=E.GENERATION_MODE_LIBRARY)), "INVALID_ARGUMENT", "repeat a name"),
    ("environment", "CreateGenerationJob", E.CreateGenerationJobRequest(spec=E.GenerationSpec(
        capabilities=[t.Capability(name="a_b")], target=GOOD_ENV, mode=E.GENERATION_MODE_LIBRARY,
        calibration_reward_min=0.7, calibration_reward_max=0.3)), "INVALID_ARGUMENT", "band"),
    ("environment", "CreateGenerationJob", E.CreateGenerationJobRequest(spec=E.GenerationSpec(
        capabilities=[t.Capability(name="a_b")], target=GOOD_ENV, mode=E.GENERATION_MODE_LIBRARY)),
     "FAILED_PRECONDITION", "no environment for capability"),
    ("environment", "GetGenerationJob", E.GetGenerationJobRequest(job_id="nope"), "NOT_FOUND", "nope"),
    ("environment", "CancelGenerationJob", E.CancelGenerationJobRequest(job_id="nope"), "NOT_FOUND", "nope"),
    ("environment", "ListGenerationJobs", E.ListGenerationJobsRequest(filter=t.JobFilter(states=[9])),
     "INVALID_ARGUMENT", "filter.states"),
    ("environment", "GetEnvironment", E.GetEnvironmentRequest(), "INVALID_ARGUMENT", "name"),
    ("environment", "GetEnvironment", E.GetEnvironmentRequest(name="ghost"), "NOT_FOUND", "ghost"),
    ("environment", "ResetEpisode", E.ResetEpisodeRequest(), "INVALID_ARGUMENT", "environment.name"),
    ("environment", "ResetEpisode", E.ResetEpisodeRequest(environment=t.EnvironmentRef(name="ghost")),
     "NOT_FOUND", "ghost"),
    ("environment", "StepEpisode", E.StepEpisodeRequest(episode_id="nope"), "NOT_FOUND", "nope"),
    ("environment", "CloseEpisode", E.CloseEpisodeRequest(), "INVALID_ARGUMENT", "episode_id"),
    # trainer
    ("trainer", "CreateTrainingJob", T.CreateTrainingJobRequest(), "INVALID_ARGUMENT", "spec.kind"),
    ("trainer", "CreateTrainingJob", T.CreateTrainingJobRequest(spec=T.TrainingSpec(
        kind=T.TRAINING_KIND_GATES, capability="moe", environments=[GOOD_ENV], policy=GOOD_POLICY)),
     "INVALID_ARGUMENT", "adapter_uris"),
    ("trainer", "CreateTrainingJob", T.CreateTrainingJobRequest(spec=T.TrainingSpec(
        kind=T.TRAINING_KIND_ADAPTER, capability="c", environments=[GOOD_ENV], policy=GOOD_POLICY,
        resume_from_uri="nope")), "INVALID_ARGUMENT", "resume_from_uri"),
    ("trainer", "CreateTrainingJob", T.CreateTrainingJobRequest(spec=T.TrainingSpec(
        kind=T.TRAINING_KIND_GATES, capability="moe", environments=[GOOD_ENV], policy=GOOD_POLICY,
        adapter_uris={"a": "file:///elsewhere/adapter_model.safetensors"})),
     "INVALID_ARGUMENT", "this trainer's artifact store"),
    ("trainer", "CreateTrainingJob", T.CreateTrainingJobRequest(spec=T.TrainingSpec(
        kind=T.TRAINING_KIND_ADAPTER, capability="Bad Name", environments=[GOOD_ENV], policy=GOOD_POLICY)),
     "INVALID_ARGUMENT", "spec.capability"),
    ("trainer", "CreateTrainingJob", T.CreateTrainingJobRequest(spec=T.TrainingSpec(
        kind=T.TRAINING_KIND_ADAPTER, capability="c", environments=[GOOD_ENV], policy=GOOD_POLICY,
        config=t.Config(values=_struct(num_generations=1)))), "INVALID_ARGUMENT", "num_generations"),
    ("trainer", "ValidateTrainingConfig", T.ValidateTrainingConfigRequest(kind=T.TRAINING_KIND_ADAPTER, config=t.Config(
        values=_struct(num_generatoins=4))), "INVALID_ARGUMENT", "did you mean 'num_generations'?"),
    ("trainer", "GetTrainingJob", T.GetTrainingJobRequest(job_id="nope"), "NOT_FOUND", "nope"),
    ("trainer", "CancelTrainingJob", T.CancelTrainingJobRequest(), "INVALID_ARGUMENT", "job_id"),
    ("trainer", "ListCheckpoints", T.ListCheckpointsRequest(job_id="nope"), "NOT_FOUND", "nope"),
    ("trainer", "ListTrainingJobs", T.ListTrainingJobsRequest(page_token="AAAA"), "INVALID_ARGUMENT", "page_token"),
    # inference
    ("inference", "LoadComposition", INF.LoadCompositionRequest(), "INVALID_ARGUMENT", "spec.name"),
    ("inference", "LoadComposition", INF.LoadCompositionRequest(spec=INF.CompositionSpec(
        name="c", base_model="micro", gates_uri="gates.safetensors")), "INVALID_ARGUMENT", "gates_uri"),
    ("inference", "LoadComposition", INF.LoadCompositionRequest(spec=INF.CompositionSpec(
        name="c", base_model="/nonexistent/model")), "PERMISSION_DENIED", "base_model"),
    ("inference", "UnloadComposition", INF.UnloadCompositionRequest(name="ghost"), "NOT_FOUND", "ghost"),
    ("inference", "Generate", INF.GenerateRequest(), "INVALID_ARGUMENT", "request.model"),
    ("inference", "Generate", INF.GenerateRequest(model="m", messages=[t.ChatMessage(role="wizard")]),
     "INVALID_ARGUMENT", "role"),
    ("inference", "Generate", INF.GenerateRequest(model="ghost", messages=[t.ChatMessage(role="user", content="hi")]),
     "NOT_FOUND", "ghost"),
    ("inference", "GenerateStream", INF.GenerateStreamRequest(model="ghost", messages=[
        t.ChatMessage(role="user", content="hi")]), "NOT_FOUND", "ghost"),
]

STREAMING = {"WatchRolloutJob", "WatchAnalysisJob", "WatchGenerationJob", "WatchTrainingJob", "GenerateStream"}


def _call(stub, method, request):
    fn = getattr(stub, method)
    if method in STREAMING:
        return list(fn(request, timeout=10))
    return fn(request, timeout=10)


def _files(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize(("service", "method", "request_msg", "code", "fragment"), CASES,
                         ids=[f"{c[0]}.{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_bad_input_gets_documented_status(embedded_stack, service, method, request_msg, code, fragment):
    before = _files(embedded_stack.root)
    with pytest.raises(grpc.RpcError) as info:
        _call(embedded_stack.stub(service), method, request_msg)
    err = info.value
    assert err.code().name == code, err.details()
    assert fragment in err.details()
    assert "Traceback" not in err.details()
    assert _files(embedded_stack.root) == before  # nothing half-written
    ch = embedded_stack.channels[f"{service}:None"]
    resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=SERVICES[service][3]))
    assert resp.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("method", ["WatchRolloutJob", "WatchAnalysisJob", "WatchGenerationJob", "WatchTrainingJob"])
def test_watch_unknown_job_is_not_found(embedded_stack, method):
    service = {"WatchRolloutJob": "rollout", "WatchAnalysisJob": "analysis", "WatchGenerationJob": "environment",
               "WatchTrainingJob": "trainer"}[method]
    req_cls = getattr(messages(service), f"{method}Request")
    with pytest.raises(grpc.RpcError) as info:
        _call(embedded_stack.stub(service), method, req_cls(job_id="nope"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_every_rpc_has_a_bad_input_case():
    covered = {(c[0], c[1]) for c in CASES} | {("rollout", "WatchRolloutJob"), ("analysis", "WatchAnalysisJob"),
                                               ("environment", "WatchGenerationJob"), ("trainer", "WatchTrainingJob")}
    # Calls with no input to get wrong are exercised in test_grpc_services.py instead.
    no_input = {("rollout", "ListRolloutEnvironments"), ("environment", "ListEnvironments"),
                ("inference", "ListCompositions")}
    missing = []
    for service, (pb2, _g, _s, full) in SERVICES.items():
        for m in pb2.DESCRIPTOR.services_by_name[full.rsplit(".", 1)[1]].methods:
            if (service, m.name) not in covered | no_input:
                missing.append(f"{service}.{m.name}")
    assert not missing, f"RPCs without a bad-input case: {missing}"


# -- bytes that are no message, and fields far too long: answered in one place (the error interceptor) --

#: Request bytes that no message type decodes (checked against every request type of the five services).
UNDECODABLE = {
    "truncated-varint": b"\x08",
    "length-past-end": b"\x0a\x7f",
    "wire-type-7": b"\x0f\x00",
    "overlong-varint": b"\x08" + b"\xff" * 10 + b"\x01",
    "unmatched-end-group": b"\x0c",
}

#: (service, full gRPC service name, method, request type, server streaming) of every RPC.
METHODS = [(service, full, m.name, m.input_type.full_name, m.server_streaming)
           for service, (pb2, _g, _s, full) in SERVICES.items()
           for m in pb2.DESCRIPTOR.services_by_name[full.rsplit(".", 1)[1]].methods]
METHODS += [("rollout", "grpc.health.v1.Health", "Check", "grpc.health.v1.HealthCheckRequest", False),
            ("inference", "grpc.health.v1.Health", "Watch", "grpc.health.v1.HealthCheckRequest", True)]


def _raw_call(channel, path: str, streaming: bool, payload: bytes):
    """A call with `payload` as the request bytes, as they are (no serializer on the client side)."""
    if streaming:
        return list(channel.unary_stream(path)(payload, timeout=10))
    return channel.unary_unary(path)(payload, timeout=10)


@pytest.mark.parametrize("kind", sorted(UNDECODABLE))
def test_undecodable_cases_decode_as_no_request_type(kind):
    """The table's premise: each payload fails to parse as every request type called below."""
    from google.protobuf import symbol_database
    from google.protobuf.message import DecodeError

    db = symbol_database.Default()
    for type_name in sorted({m[3] for m in METHODS}):
        with pytest.raises(DecodeError):
            db.GetSymbol(type_name).FromString(UNDECODABLE[kind])


@pytest.mark.parametrize(("service", "full", "method", "type_name", "streaming"), METHODS,
                         ids=[f"{m[1].rsplit('.', 1)[-1]}.{m[2]}" for m in METHODS])
def test_undecodable_bytes_are_invalid_argument(embedded_stack, service, full, method, type_name, streaming):
    before = _files(embedded_stack.root)
    with open_channel(Endpoint(embedded_stack.targets[service])) as ch:
        for kind, payload in UNDECODABLE.items():
            with pytest.raises(grpc.RpcError) as info:
                _raw_call(ch, f"/{full}/{method}", streaming, payload)
            err = info.value
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (kind, err.code(), err.details())
            assert err.details() == (f"{full}/{method}: the request bytes do not decode as a {type_name} message; "
                                     "send that message serialized with protobuf"), kind
        resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=SERVICES[service][3]))
    assert resp.status == health_pb2.HealthCheckResponse.SERVING
    assert _files(embedded_stack.root) == before


def test_undecodable_bytes_without_a_token_are_unauthenticated(authed_stack):
    """Auth answers before the request is looked at: no token, no hint about the message."""
    with open_channel(Endpoint(authed_stack.targets["trainer"])) as ch:
        with pytest.raises(grpc.RpcError) as info:
            _raw_call(ch, "/trace.v1.TrainerService/GetTrainingJob", False, UNDECODABLE["length-past-end"])
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_undecodable_bytes_are_counted_as_invalid_argument(embedded_stack):
    import httpx

    def count() -> float:
        text = httpx.get(embedded_stack.metrics_urls["analysis"], timeout=5).text
        prefix = 'trace_analysis_rpc_requests_total{code="INVALID_ARGUMENT",method="GetAnalysisJob"}'
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(prefix))

    before = count()
    with open_channel(Endpoint(embedded_stack.targets["analysis"])) as ch, pytest.raises(grpc.RpcError):
        _raw_call(ch, "/trace.v1.AnalysisService/GetAnalysisJob", False, UNDECODABLE["wire-type-7"])
    assert count() == before + 1


LONG_RUN = "x" * 70_000           # 70 KB in one unbroken value (an id)
LONG_WORDS = "ab " * 23_334       # 70 KB of short words
LONG_UTF8 = "é" * 35_000          # 70 KB of two-byte UTF-8


def _oversized_cases(v: str):
    """(service, method, request, code) with `v` in an id / name field; the code is the one the
    same request with a short unknown value gets, or INVALID_ARGUMENT where the field has a size cap
    (trace_common/limits.py) that `v` is over."""
    user = [t.ChatMessage(role="user", content="hi")]
    return [
        ("rollout", "GetRolloutJob", R.GetRolloutJobRequest(job_id=v), "NOT_FOUND"),
        ("rollout", "CancelRolloutJob", R.CancelRolloutJobRequest(job_id=v), "NOT_FOUND"),
        ("rollout", "WatchRolloutJob", R.WatchRolloutJobRequest(job_id=v), "NOT_FOUND"),
        ("rollout", "ListRolloutJobs", R.ListRolloutJobsRequest(page_token=v), "INVALID_ARGUMENT"),
        ("rollout", "CreateRolloutJob", R.CreateRolloutJobRequest(spec=R.RolloutSpec(
            environment=t.EnvironmentRef(name=v), policy=GOOD_POLICY)), "INVALID_ARGUMENT"),
        ("analysis", "GetAnalysisJob", A.GetAnalysisJobRequest(job_id=v), "NOT_FOUND"),
        ("analysis", "CreateAnalysisJob", A.CreateAnalysisJobRequest(spec=A.AnalysisSpec(
            rollout_uris=[v], mode=A.ANALYST_MODE_DIAGNOSTICS)), "INVALID_ARGUMENT"),
        ("environment", "GetEnvironment", E.GetEnvironmentRequest(name=v), "NOT_FOUND"),
        ("environment", "StepEpisode", E.StepEpisodeRequest(episode_id=v), "NOT_FOUND"),
        ("environment", "GetGenerationJob", E.GetGenerationJobRequest(job_id=v), "NOT_FOUND"),
        ("trainer", "GetTrainingJob", T.GetTrainingJobRequest(job_id=v), "NOT_FOUND"),
        ("trainer", "ListCheckpoints", T.ListCheckpointsRequest(job_id=v), "NOT_FOUND"),
        ("inference", "UnloadComposition", INF.UnloadCompositionRequest(name=v), "NOT_FOUND"),
        ("inference", "Generate", INF.GenerateRequest(model=v, messages=user), "INVALID_ARGUMENT"),
        ("inference", "GenerateStream", INF.GenerateStreamRequest(model=v, messages=user), "INVALID_ARGUMENT"),
    ]


OVERSIZED = [(*case, filler) for filler, v in (("run", LONG_RUN), ("words", LONG_WORDS), ("utf8", LONG_UTF8))
             for case in _oversized_cases(v)]


@pytest.mark.parametrize(("service", "method", "request_msg", "code", "filler"), OVERSIZED,
                         ids=[f"{c[0]}.{c[1]}-{c[4]}" for c in OVERSIZED])
def test_oversized_field_gets_a_bounded_status(embedded_stack, service, method, request_msg, code, filler):
    from trace_common.grpc.interceptors import MAX_DETAIL_CHARS, MAX_ECHO_CHARS

    with pytest.raises(grpc.RpcError) as info:
        _call(embedded_stack.stub(service), method, request_msg)
    err = info.value
    details = err.details() or ""
    assert err.code().name == code, (err.code(), details[:300])
    assert 0 < len(details) <= MAX_DETAIL_CHARS
    assert max(len(w) for w in details.split()) <= MAX_ECHO_CHARS + 3, details[:300]
    assert "Traceback" not in details
