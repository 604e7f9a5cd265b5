"""Every request field that names a model, adapter, composition or gates file is confined to the
service's own store and the operator's model roots, over real gRPC (each service a real server on
loopback, configured as an operator would: `artifact_root` = a store, `model_roots` = one directory).

An adversarial review made rollout jobs, LoadComposition, and trainer / calibration jobs load
directories of its own choosing, read a local gates file with no digest check, and told existing
paths from missing ones by the error text. Here: a reference inside the store or the operator's root
is accepted (a job is created, a composition loads); one outside (an absolute path, a `..` escape, a
symlink out of the store, another bucket, a path that exists and one that does not) is
PERMISSION_DENIED before a job exists, with one message naming the field and what is allowed.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
from pathlib import Path

import grpc
import pytest
from google.protobuf.struct_pb2 import Struct

from tests.unit.inference.helpers import write_tiny_composition
from tests.unit.inference.tiny import cached_world
from trace_common.grpc.client import Endpoint, messages, new_request_id, open_channel, stub
from trace_common.proto.trace.v1 import types_pb2 as t

pytestmark = pytest.mark.integration
R, T, E, INF = messages("rollout"), messages("trainer"), messages("environment"), messages("inference")
SERVICES = ("rollout", "trainer", "environment", "inference")


class Servers:
    """The four services that load models, each a real gRPC server on loopback, on one event loop."""

    def __init__(self, **settings):
        from services.launch import build
        from trace_common.grpc.server import TraceServer

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.servers, self.channels = {}, []
        for name in SERVICES:
            extra = {"calibration_max_tokens": 8} if name == "environment" else {}
            server = TraceServer(*build(name, host="127.0.0.1", port=0, metrics_port=0, **settings, **extra),
                                 warn_without_auth=False)
            self._call(server.start())
            self.servers[name] = server

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(120)

    def stub(self, name: str):
        channel = open_channel(Endpoint(self.servers[name].target))
        self.channels.append(channel)
        return stub(name, channel)

    def close(self) -> None:
        for channel in self.channels:
            channel.close()
        for server in self.servers.values():
            self._call(server.stop(1.0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _fake_model(d: Path) -> Path:
    """A directory the request-time checks accept as a model and as an adapter (its files are stubs)."""
    d.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "adapter_config.json"):
        (d / name).write_text("{}")
    return d


def _put_tree(store_dir: Path, prefix: str, src: Path) -> Path:
    """`src`'s files written into the store under `prefix` (with their sha256 records, as every artifact)."""
    from trace_common.artifacts import open_store

    store = open_store(store_dir.as_uri())
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        store.put_file(f"{prefix}/{f.relative_to(src).as_posix()}", f)
    return store_dir / prefix


@pytest.fixture(scope="module")
def world():
    return cached_world()


@pytest.fixture(scope="module")
def site(tmp_path_factory, world):
    """The operator's store and model root; the attacker's directory outside both."""
    tmp = tmp_path_factory.mktemp("confinement")
    store, models, outside = tmp / "store", tmp / "operator-models", tmp / "outside"
    for d in ("fake", "composition"):
        _put_tree(store, f"runs/r/{d}", _fake_model(tmp / "stubs" / d))
        _fake_model(models / d)
    _fake_model(outside / "m")
    (outside / "m" / "gates.safetensors").write_bytes(b"attacker")
    (store / "link-out").symlink_to(outside / "m")
    shutil.copytree(world.model_dir, models / "tiny-base")          # a real model under the operator's root
    for name, path in world.adapter_dirs.items():
        shutil.copytree(path, models / f"tiny-{name}")
    for bad, text in (("unknown-type", '{"model_type": "no-such-architecture"}'), ("not-json", "{ not json")):
        shutil.copytree(world.model_dir, models / bad)
        (models / bad / "config.json").write_text(text)
    config = json.loads((world.model_dir / "config.json").read_text())
    for bad, change in (("hidden-size-text", {"hidden_size": "abc"}), ("negative-layers", {"num_hidden_layers": -1})):
        shutil.copytree(world.model_dir, models / bad)
        (models / bad / "config.json").write_text(json.dumps({**config, **change}))
    shutil.copytree(world.model_dir, models / "garbage-weights")
    for weights in (models / "garbage-weights").glob("*.safetensors"):
        weights.write_bytes(b"garbage")
    art = write_tiny_composition(world, store, prefix="runs/r/moe")   # gates written through the store
    servers = Servers(artifact_root=store.as_uri(), model_roots=[str(models)])
    yield dict(tmp=tmp, store=store, models=models, outside=outside, gates=art.gates_uri, servers=servers)
    servers.close()


#: Where a reference may point: accepted ones, then the refused ones.
INSIDE = {"store": "{store}/runs/r/fake", "store-uri": "file://{store}/runs/r/fake", "root": "{models}/fake"}
OUTSIDE = {
    "absolute": "{outside}/m",                      # exists, holds a model
    "missing": "{outside}/not-there",               # does not exist: the same answer
    "dotdot": "{store}/../outside/m",               # `..` out of the store
    "symlink": "{store}/link-out",                  # a link in the store pointing out of it
    "bucket": "s3://another-bucket/m",              # another store
    "system": "/etc",
}
#: Fields whose spec validator refuses a `..` path before the confinement rule (INVALID_ARGUMENT).
DOTDOT_SYNTAX = {"rollout.adapter_uri", "rollout.composition_uri", "trainer.adapter_uri",
                 "environment.adapter_uri", "inference.adapter", "inference.gates_uri"}


def _jobs(servers, service: str) -> int:
    s = servers.stub(service)
    if service == "rollout":
        return len(s.ListRolloutJobs(R.ListRolloutJobsRequest()).jobs)
    if service == "trainer":
        return len(s.ListTrainingJobs(T.ListTrainingJobsRequest()).jobs)
    if service == "environment":
        return len(s.ListGenerationJobs(E.ListGenerationJobsRequest()).jobs)
    return len(s.ListCompositions(INF.ListCompositionsRequest()).compositions)


def _policy(site, field: str, ref: str) -> t.PolicyRef:
    """An in-process policy with `ref` in `field`; its other model is an accepted stub in the store
    (a job that is created fails fast at loading it: nothing real is built or loaded)."""
    kw = {"model": str(site["store"] / "runs" / "r" / "fake"), field: ref}
    return t.PolicyRef(backend=t.POLICY_BACKEND_IN_PROCESS, **kw)


def _request(site, target: str, ref: str):
    """(service, a call creating one job or loading one composition with `ref` in field `target`,
    the field name the service reports)."""
    service, field = target.split(".")
    servers = site["servers"]
    if service == "rollout":
        spec = R.RolloutSpec(environment=t.EnvironmentRef(name="store"), policy=_policy(site, field, ref),
                             tasks=R.TaskSelection(split="train", limit=1), max_turns=1)
        return lambda: servers.stub("rollout").CreateRolloutJob(
            R.CreateRolloutJobRequest(spec=spec, run_id="r", request_id=new_request_id())).job.job_id, \
            f"spec.policy.{field}"
    if service == "trainer":
        values = Struct()
        values.update({"max_steps": 1, "groups_per_batch": 2, "num_generations": 2, "max_completion_length": 4})
        spec = T.TrainingSpec(kind=T.TRAINING_KIND_ADAPTER, capability="precondition_verification",
                              environments=[t.EnvironmentRef(name="store", params={"task_types": "precondition_check"})],
                              policy=_policy(site, field, ref), config=t.Config(values=values), executor=T.EXECUTOR_LOCAL)
        return lambda: servers.stub("trainer").CreateTrainingJob(
            T.CreateTrainingJobRequest(spec=spec, run_id="r", request_id=new_request_id())).job.job_id, \
            f"spec.policy.{field}"
    if service == "environment":
        spec = E.GenerationSpec(capabilities=[t.Capability(name="precondition_verification")],
                                target=t.EnvironmentRef(name="store"), mode=E.GENERATION_MODE_LIBRARY,
                                calibration_policy=_policy(site, field, ref))
        return lambda: servers.stub("environment").CreateGenerationJob(
            E.CreateGenerationJobRequest(spec=spec, run_id="r", request_id=new_request_id())).job.job_id, \
            f"spec.calibration_policy.{field}"
    models = site["models"]
    base, adapters, gates = str(models / "tiny-base"), [("refunds", str(models / "tiny-refunds")),
                                                       ("addresses", str(models / "tiny-addresses"))], site["gates"]
    if field == "base_model":
        base = ref
    elif field == "adapter":
        adapters[0] = ("refunds", ref)
    else:
        gates = ref
    spec = INF.CompositionSpec(name="c-" + new_request_id()[:8], base_model=base, gates_uri=gates,
                               adapters=[INF.AdapterRef(name=n, uri=u) for n, u in adapters])
    reported = {"base_model": "base_model", "adapter": "adapters.refunds", "gates_uri": "gates_uri"}[field]
    return lambda: servers.stub("inference").LoadComposition(
        INF.LoadCompositionRequest(spec=spec)).composition.spec.name, reported


JOB_FIELDS = ["rollout.model", "rollout.adapter_uri", "rollout.composition_uri", "trainer.model",
              "trainer.adapter_uri", "environment.model", "environment.adapter_uri"]
LOAD_FIELDS = ["inference.base_model", "inference.adapter", "inference.gates_uri"]


def _cancel(site, service: str, job_id: str) -> None:
    s = site["servers"].stub(service)
    cancel = {"rollout": lambda: s.CancelRolloutJob(R.CancelRolloutJobRequest(job_id=job_id)),
              "trainer": lambda: s.CancelTrainingJob(T.CancelTrainingJobRequest(job_id=job_id)),
              "environment": lambda: s.CancelGenerationJob(E.CancelGenerationJobRequest(job_id=job_id))}[service]
    try:
        cancel()
    except grpc.RpcError as err:  # it already ended: the stub model does not load
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err.details()
    if service == "trainer":
        # the next case trains the same run and capability, which the trainer refuses while this job still
        # writes there (one writer per prefix): wait until it has ended (on a loaded machine its worker
        # process takes seconds to stop)
        deadline = time.monotonic() + 120
        ended = {t.JOB_STATE_SUCCEEDED, t.JOB_STATE_FAILED, t.JOB_STATE_CANCELLED}
        while (job := s.GetTrainingJob(T.GetTrainingJobRequest(job_id=job_id)).job).state not in ended:
            assert time.monotonic() < deadline, f"training job {job_id} did not end within 120 s of its cancel"
            time.sleep(0.2)
        # cancelled, or failed loading the stub model -- never a worker refusing what the service accepted
        assert job.state != t.JOB_STATE_FAILED or job.error.code not in ("PERMISSION_DENIED", "INVALID_ARGUMENT"), \
            job.error


@pytest.mark.parametrize("where", sorted(INSIDE))
@pytest.mark.parametrize("target", JOB_FIELDS)
def test_a_reference_in_the_store_or_a_model_root_creates_the_job(site, target, where):
    service = target.split(".")[0]
    ref = INSIDE[where].format(**site)
    if target.endswith("composition_uri"):
        ref = ref.replace("/fake", "/composition") + "/composition.json"
    before = _jobs(site["servers"], service)
    call, _ = _request(site, target, ref)
    job_id = call()
    assert job_id and _jobs(site["servers"], service) == before + 1
    _cancel(site, service, job_id)


@pytest.mark.parametrize("where", ["root", "store"])
def test_a_composition_in_the_store_or_a_model_root_loads(site, world, where):
    """The real tiny model: under the operator's root, or copied into the store; the gates are in the store."""
    base = site["models"] / "tiny-base"
    if where == "store":
        base = _put_tree(site["store"], "runs/r/tiny-base", site["models"] / "tiny-base")
    call, _ = _request(site, "inference.base_model", str(base))
    assert call().startswith("c-")


@pytest.mark.parametrize("where", sorted(OUTSIDE))
@pytest.mark.parametrize("target", JOB_FIELDS + LOAD_FIELDS)
def test_a_reference_outside_is_refused_before_a_job_exists(site, target, where):
    service = target.split(".")[0]
    ref = OUTSIDE[where].format(**site)
    if target.endswith("gates_uri") and where in ("absolute", "symlink"):
        ref += "/gates.safetensors"                   # a file that is there, outside the store
    before = _jobs(site["servers"], service)
    call, field = _request(site, target, ref)
    with pytest.raises(grpc.RpcError) as err:
        call()
    details = err.value.details()
    assert _jobs(site["servers"], service) == before   # no job was created, no composition loaded
    if where == "dotdot" and target in DOTDOT_SYNTAX:
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'..'" in details
        return
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, details
    assert details.startswith(f"{field}: ") and site["store"].as_uri() in details
    assert site["models"].as_uri() in details and "TRACE_" in details and "_MODEL_ROOTS" in details
    shown = details.replace(repr(ref), "REF")
    assert str(site["outside"]) not in shown and ".cache" not in shown and str(Path.home()) + "/" not in shown


@pytest.mark.parametrize("target", JOB_FIELDS + LOAD_FIELDS)
def test_an_existing_and_a_missing_path_get_the_same_answer(site, target):
    answers = []
    for where in ("absolute", "missing"):
        ref = OUTSIDE[where].format(**site)
        call, _ = _request(site, target, ref)
        with pytest.raises(grpc.RpcError) as err:
            call()
        answers.append((err.value.code(), err.value.details().replace(repr(ref), "REF")))
    assert answers[0] == answers[1]


@pytest.mark.parametrize("bad", ["unknown-type", "not-json", "hidden-size-text", "negative-layers", "garbage-weights"])
def test_a_base_model_whose_config_does_not_load_is_invalid_argument(site, bad):
    """An allowed directory whose config.json no loader reads: INVALID_ARGUMENT naming base_model
    (was INTERNAL), and nothing is loaded."""
    before = _jobs(site["servers"], "inference")
    call, _ = _request(site, "inference.base_model", str(site["models"] / bad))
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("base_model: ")
    assert _jobs(site["servers"], "inference") == before


def test_gates_without_a_recorded_digest_are_not_used(site):
    """A gates file under the operator's root that no store wrote (no sha256 sidecar) is refused."""
    bare = site["models"] / "bare-gates.safetensors"
    shutil.copy(site["store"] / "runs/r/moe/gates.safetensors", bare)
    call, _ = _request(site, "inference.gates_uri", bare.as_uri())
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == grpc.StatusCode.DATA_LOSS or "sha256" in err.value.details()
    assert json.loads((site["store"] / "runs/r/moe/composition.json").read_text())["num_slots"] == 3
