"""Paths a request names for data stay where the operator allows, over real gRPC (the embedded stack
on loopback): an analysis's `rollout_uris` (its own run's rollouts in the analysis service's store, or
an operator-listed store prefix) and a tau2 target's `data` directory (under an operator-listed data
root) -- else PERMISSION_DENIED before a job exists, with one message whether or not the path exists.

An adversarial review read another run's trajectories into its own run's labels.jsonl by naming them
in rollout_uris, and pointed the tau2 `data` parameter at any directory, the errors telling existing
paths from missing ones and naming HOME and the service's default data path.
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

import grpc
import pytest

from tests.support.tau2_data import needs_tau2, tau2_data_root
from tests.unit.analysis.fixtures import planted_set
from trace_common.artifacts import open_store
from trace_common.env import dumps_jsonl
from trace_common.grpc.client import messages, new_request_id
from trace_common.proto.trace.v1 import types_pb2 as t
from tracectl.cli import main

pytestmark = pytest.mark.integration
A, R, E, T = (messages(s) for s in ("analysis", "rollout", "environment", "trainer"))
#: The data root the embedded_stack fixture lists (None without TRACE_TAU2_DATA: the tests naming it skip).
TAU2 = root.resolve() if (root := tau2_data_root()) else None


def _jobs(stack, service: str, run_id: str) -> int:
    method, request = {"analysis": ("ListAnalysisJobs", A.ListAnalysisJobsRequest),
                       "rollout": ("ListRolloutJobs", R.ListRolloutJobsRequest),
                       "environment": ("ListGenerationJobs", E.ListGenerationJobsRequest),
                       "trainer": ("ListTrainingJobs", T.ListTrainingJobsRequest)}[service]
    return len(getattr(stack.stub(service), method)(request(filter=t.JobFilter(run_id=run_id))).jobs)


def _refused(call, stack, service: str, run_id: str, field: str) -> str:
    """The details of a PERMISSION_DENIED naming `field`, after checking no job of `run_id` exists."""
    with pytest.raises(grpc.RpcError) as err:
        call()
    details = err.value.details() or ""
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, details
    assert field in details, details
    assert _jobs(stack, service, run_id) == 0
    return details


# -- analysis rollout_uris ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stores(embedded_stack, tmp_path_factory):
    """This run's rollout, another run's (the victim's), a store outside the service's, an operator
    store prefix, and symlinks inside this run's rollouts pointing at the victim's."""
    store = embedded_stack.domain("analysis").store
    run = f"mine-{uuid.uuid4().hex[:6]}"
    data = dumps_jsonl(planted_set())
    own = store.put_bytes(f"runs/{run}/rollouts/part-000.jsonl", data).uri
    victim = store.put_bytes(f"runs/victim-{run}/rollouts/part-000.jsonl", data)
    outside_dir = tmp_path_factory.mktemp("outside")
    outside = open_store(outside_dir.as_uri()).put_bytes("rollouts/part-000.jsonl", data).uri
    shared_dir = tmp_path_factory.mktemp("operator-rollouts")
    shared = open_store(shared_dir.as_uri()).put_bytes("r1/part-000.jsonl", data).uri
    base = Path(store.root_uri.removeprefix("file://")) / "runs"
    (base / run / "rollouts" / "link.jsonl").symlink_to(base / f"victim-{run}" / "rollouts" / "part-000.jsonl")
    (base / run / "rollouts" / "link.jsonl.sha256").symlink_to(
        base / f"victim-{run}" / "rollouts" / "part-000.jsonl.sha256")
    (base / run / "rollouts" / "linkdir").symlink_to(base / f"victim-{run}" / "rollouts")
    (shared_dir / "out").symlink_to(outside_dir / "rollouts")
    return {"run": run, "root": store.root_uri.rstrip("/"), "own": own, "victim": victim.uri,
            "outside": outside, "shared_dir": shared_dir, "shared": shared}


@contextlib.contextmanager
def rollout_root(stack, uri: str):
    """The operator lists `uri` as a store prefix analyses may read (in-process, as the embedded
    stack's operator does), for the duration of the block."""
    roots = stack.domain("analysis").rollout_roots
    roots.append(uri)
    try:
        yield
    finally:
        roots.remove(uri)


def _analyze(stack, uri: str, run_id: str):
    return stack.stub("analysis").CreateAnalysisJob(A.CreateAnalysisJobRequest(
        spec=A.AnalysisSpec(rollout_uris=[uri], mode=A.ANALYST_MODE_DIAGNOSTICS), run_id=run_id,
        request_id=new_request_id())).job


REFUSED_URIS = {
    "another run's rollouts": "{victim}",
    "another run's, not there": "{root}/runs/victim-{run}/rollouts/absent.jsonl",
    "this run, not its rollouts": "{root}/runs/{run}/analysis/part-000.jsonl",
    "the rollouts folder itself": "{root}/runs/{run}/rollouts",
    "a file outside the store": "{outside}",
    "an absolute path outside": "{outside_path}",
    "a path that is not there": "/nonexistent/trace/part-000.jsonl",
    "'..' out of this run": "{root}/runs/{run}/rollouts/../../victim-{run}/rollouts/part-000.jsonl",
    "encoded '..'": "{root}/runs/{run}/rollouts/%2E%2E/%2E%2E/victim-{run}/rollouts/part-000.jsonl",
    "a symlink to another run's file": "{root}/runs/{run}/rollouts/link.jsonl",
    "a symlinked folder": "{root}/runs/{run}/rollouts/linkdir/part-000.jsonl",
    "another bucket": "s3://another-bucket/runs/{run}/rollouts/part-000.jsonl",
    "an operator root not listed": "{shared}",
}


@pytest.mark.parametrize("where", list(REFUSED_URIS.values()), ids=list(REFUSED_URIS))
def test_a_rollout_uri_outside_this_run_is_refused_before_a_job(embedded_stack, stores, where):
    uri = where.format(**stores, outside_path=stores["outside"].removeprefix("file://"))
    details = _refused(lambda: _analyze(embedded_stack, uri, stores["run"]), embedded_stack, "analysis",
                       stores["run"], "spec.rollout_uris[0]")
    # one message for every refusal: it names what is allowed, never the URI or whether it exists
    expected = _refused(lambda: _analyze(embedded_stack, "/nonexistent/x.jsonl", stores["run"]), embedded_stack,
                        "analysis", stores["run"], "spec.rollout_uris[0]")
    assert details == expected and f"runs/{stores['run']}/rollouts/" in details
    assert "TRACE_ANALYSIS_ROLLOUT_ROOTS" in details and "victim" not in details
    # nor where the service's store lies (it may be under HOME)
    assert stores["root"].removeprefix("file://") not in details and str(Path.home()) not in details


def test_a_symlink_out_of_an_operator_root_is_refused(embedded_stack, stores):
    with rollout_root(embedded_stack, stores["shared_dir"].as_uri()):
        _refused(lambda: _analyze(embedded_stack, (stores["shared_dir"] / "out" / "part-000.jsonl").as_uri(),
                                  stores["run"]), embedded_stack, "analysis", stores["run"], "spec.rollout_uris[0]")


@pytest.mark.parametrize("which", ["own", "shared"])
def test_this_runs_rollouts_and_an_operator_root_are_read(embedded_stack, stores, which):
    run = f"{stores['run']}-{which}" if which == "shared" else stores["run"]
    with rollout_root(embedded_stack, stores["shared_dir"].as_uri()):
        job = _analyze(embedded_stack, stores[which], run)
    stub = embedded_stack.stub("analysis")
    final = [m.job for m in stub.WatchAnalysisJob(A.WatchAnalysisJobRequest(job_id=job.job_id), timeout=120)][-1]
    assert final.state == t.JOB_STATE_SUCCEEDED, final.error.message
    assert final.metrics["trajectories"] == len(planted_set())


# -- tau2 data directories -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """A directory outside every root, and an extra root holding a symlink that points out of it."""
    outside = tmp_path_factory.mktemp("tau2-outside")
    extra = tmp_path_factory.mktemp("tau2-extra-root")
    (extra / "out").symlink_to(outside)
    return {"outside": outside, "extra": extra}


def _rollout(stack, run_id: str, uri: str = "", params: dict | None = None):
    spec = R.RolloutSpec(environment=t.EnvironmentRef(name="tau2-retail", uri=uri, params=params or {}),
                         policy=t.PolicyRef(backend=t.POLICY_BACKEND_IN_PROCESS, model="micro"),
                         tasks=R.TaskSelection(split="train", limit=1), max_turns=2)
    return stack.stub("rollout").CreateRolloutJob(R.CreateRolloutJobRequest(spec=spec, run_id=run_id,
                                                                            request_id=new_request_id())).job


def _generate(stack, run_id: str, uri: str = "", params: dict | None = None):
    spec = E.GenerationSpec(capabilities=[t.Capability(name="argument_formatting")],
                            target=t.EnvironmentRef(name="tau2-retail", uri=uri, params=params or {}),
                            mode=E.GENERATION_MODE_LIBRARY)
    return stack.stub("environment").CreateGenerationJob(E.CreateGenerationJobRequest(
        spec=spec, run_id=run_id, request_id=new_request_id())).job


def _train(stack, run_id: str, uri: str = "", params: dict | None = None, kind: str = "adapter"):
    """A training job on tau2-retail: an adapter (one environment), or gates over one adapter of this
    run (refused before its adapter is looked at when the data directory is)."""
    env = t.EnvironmentRef(name="tau2-retail", uri=uri, params=params or {})
    policy = t.PolicyRef(backend=t.POLICY_BACKEND_IN_PROCESS, model="micro")
    if kind == "gates":
        root = stack.domain("trainer").store.root_uri.rstrip("/")
        spec = T.TrainingSpec(kind=T.TRAINING_KIND_GATES, capability=f"{run_id}-moe", environments=[env],
                              policy=policy, adapter_uris={"cap": f"{root}/runs/{run_id}/adapters/cap/v1"})
    else:
        spec = T.TrainingSpec(kind=T.TRAINING_KIND_ADAPTER, capability="cap", environments=[env], policy=policy)
    return stack.stub("trainer").CreateTrainingJob(T.CreateTrainingJobRequest(
        spec=spec, run_id=run_id, request_id=new_request_id())).job


#: service -> (create a job naming the data, the field prefix of its refusal)
CREATE = {"rollout": (_rollout, "spec.environment."), "environment": (_generate, "spec.target."),
          "trainer": (_train, "spec.environments[0]."),
          "trainer-gates": (lambda *a, **kw: _train(*a, **kw, kind="gates"), "spec.environments[0].")}

#: (how the request names the directory, the field the refusal names); {outside} exists, /nonexistent does not
REFUSED_DATA = {
    "outside, existing (uri)": ("uri", "file://{outside}", "uri"),
    "outside, not there (uri)": ("uri", "file:///nonexistent/tau2/retail", "uri"),
    "outside, existing (params)": ("params", "{outside}", "params['data']"),
    "outside, not there (params)": ("params", "/nonexistent/tau2/retail", "params['data']"),
    "HOME": ("params", "{home}", "params['data']"),
    "'..' out of the root": ("params", "{tau2}/retail/../../..{outside}", "params['data']"),
    "encoded '..' (uri)": ("uri", "file://{tau2}/retail/%2E%2E/%2E%2E/%2E%2E{outside}", "uri"),
    "a symlink out of a root": ("params", "{extra}/out", "params['data']"),
    "relative": ("params", "retail", "params['data']"),
    "another scheme": ("params", "s3://bucket/tau2/retail", "params['data']"),
}


@pytest.mark.parametrize("service", list(CREATE))
@pytest.mark.parametrize(("how", "where", "field"), [
    pytest.param(*case, id=name, marks=[needs_tau2] if "{tau2}" in case[1] else []) for name, case in REFUSED_DATA.items()])
def test_a_data_directory_outside_the_roots_is_refused_before_a_job(embedded_stack, dirs, service, how, where,
                                                                   field):
    value = where.format(outside=dirs["outside"], extra=dirs["extra"], tau2=TAU2, home=Path.home())
    run = f"data-{uuid.uuid4().hex[:8]}"
    create, prefix = CREATE[service]
    kw = {"uri": value} if how == "uri" else {"params": {"data": value}}
    setting = f"TRACE_{service.split('-')[0].upper()}_DATA_ROOTS"
    service = service.split("-")[0]   # trainer-gates: the trainer's jobs
    stack = embedded_stack
    stack.allow_data_root(dirs["extra"])
    details = _refused(lambda: create(stack, run, **kw), stack, service, run, prefix + field)
    # one message whatever the path: never whether it exists, where it points, HOME or the service's data
    other = _refused(lambda: create(stack, run, **({"uri": "file:///nonexistent/x"} if how == "uri" else
                                                    {"params": {"data": "/nonexistent/x"}})), stack, service, run,
                     prefix + field)
    assert details == other and setting in details
    for secret in (str(Path.home()), *(str(p) for p in (TAU2, tau2_data_root()) if p), str(dirs["outside"])):
        assert secret not in details, details


@needs_tau2
@pytest.mark.parametrize("service", ["rollout", "environment", "trainer"])
@pytest.mark.parametrize("how", ["uri", "params"])
def test_a_data_directory_under_a_root_is_accepted(embedded_stack, service, how):
    retail = TAU2 / "retail"
    run = f"data-ok-{uuid.uuid4().hex[:8]}"
    kw = {"uri": retail.as_uri()} if how == "uri" else {"params": {"data": str(retail)}}
    if service == "rollout":
        kw.setdefault("params", {})["user_replies"] = '["###STOP###"]'   # a scripted user: no LLM needed
        job = _rollout(embedded_stack, run, **kw)
        cancel = embedded_stack.stub("rollout").CancelRolloutJob
        cancel(R.CancelRolloutJobRequest(job_id=job.job_id))
    elif service == "trainer":
        job = _train(embedded_stack, run, **kw)
        embedded_stack.stub("trainer").CancelTrainingJob(T.CancelTrainingJobRequest(job_id=job.job_id))
    else:
        job = _generate(embedded_stack, run, **kw)
        embedded_stack.stub("environment").CancelGenerationJob(E.CancelGenerationJobRequest(job_id=job.job_id))
    assert job.job_id and job.run_id == run
    assert _jobs(embedded_stack, service, run) == 1


@pytest.mark.parametrize("service", ["rollout", "environment", "trainer"])   # (gates: tests/unit/trainer/gates)
def test_the_services_own_missing_data_is_not_named(embedded_stack, tmp_path, monkeypatch, service):
    """No data named and the service's own ($TRACE_TAU2_DATA) missing: NOT_FOUND naming the environment
    and the settings, never that path (it may lie under HOME)."""
    missing = tmp_path / f"home-{uuid.uuid4().hex[:8]}" / f"tau2-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("TRACE_TAU2_DATA", str(missing))
    create, _ = CREATE[service]
    run = f"own-{uuid.uuid4().hex[:8]}"
    with pytest.raises(grpc.RpcError) as err:
        create(embedded_stack, run)
    details = err.value.details() or ""
    assert err.value.code() == grpc.StatusCode.NOT_FOUND, details
    assert "tau2-retail" in details and "TRACE_TAU2_DATA" in details, details
    for part in (missing, *missing.parents[:3]):
        assert str(part) not in details, details
    assert missing.name not in details and missing.parent.name not in details, details
    assert _jobs(embedded_stack, service.split("-")[0], run) == 0


@needs_tau2
@pytest.mark.parametrize("how", ["--env", "--env-param"])
def test_tracectl_train_lists_the_data_directory_it_names(tmp_path, monkeypatch, capsys, how):
    """`tracectl train` with its own embedded services lists the tau2 directory its input names as the
    trainer's data root (no other root: TRACE_TAU2_DATA unset), so the job is accepted."""
    monkeypatch.delenv("TRACE_TAU2_DATA", raising=False)
    monkeypatch.delenv("TRACE_TRAINER_DATA_ROOTS", raising=False)
    monkeypatch.chdir(tmp_path)
    named = (["--env", str(TAU2 / "retail")] if how == "--env" else
             ["--env", "tau2-retail", "--env-param", f"data={TAU2 / 'retail'}"])
    code = main(["train", "--capability", "cap", *named, "--model", "micro", "--set", "max_steps=1", "--detach"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out.strip().startswith("training-"), out.out
