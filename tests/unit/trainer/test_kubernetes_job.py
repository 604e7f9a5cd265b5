"""Training jobs as Kubernetes Jobs: the manifest passes the 1.32 schema (strict), and create /
watch / cancel run through the official client against an emulated API server (kmock). The
emulator runs no pods: each test plays the pod's part -- the worker's event log in the artifact
store (written by the worker's own `EventSink`) and the Job status the Job controller would set."""

from __future__ import annotations

import asyncio
import copy
import threading
import time

import kubernetes_validate
import pytest
from kubernetes import client

from services.trainer.jobspec import ENVIRONMENT_TOKEN_ENV, SPEC_ENV, WorkerSpec, events_key_for
from services.trainer.kubernetes_job import (
    STATE_READ_TRIES,
    KubernetesExecutor,
    build_job,
    job_name,
    manifest_dict,
)
from services.trainer.service import Training
from services.trainer.settings import TrainerSettings
from services.trainer.specs import TrainingSpecModel
from services.trainer.worker import EventSink
from tests.support.tau2_data import require_tau2_data
from trace_common.artifacts import open_store
from trace_common.errors import FailedPrecondition, ResourceExhausted, Unavailable
from trace_common.jobs import JobState

GPU_POOL = dict(job_image="registry.example/trace-trainer:1.2.3", job_gpus=4, job_node_selector={"trace.dev/pool": "gpu"},
                job_tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                job_backoff_limit=3, job_s3_secret_name="trace-s3", job_service_account="trace-trainer",
                job_auth_from="trace-auth:token",
                job_extra_env={"NCCL_DEBUG": "WARN"}, job_active_deadline_seconds=7200)


def wspec(job_id="training-20260101-000000-abcd1234", root="s3://trace-artifacts") -> WorkerSpec:
    prefix = "runs/r1/adapters/precondition_verification"
    return WorkerSpec(job_id=job_id, run_id="r1", capability="precondition_verification",
                      environment={"name": "store", "version": "", "uri": "", "params": {}},
                      policy={"backend": "POLICY_BACKEND_IN_PROCESS", "model": "micro"}, config={"max_steps": 3},
                      artifact_root=root, s3_endpoint="minio:9000", s3_access_key="trace", prefix=prefix,
                      events_key=events_key_for(prefix, job_id))


@pytest.mark.parametrize("settings", [
    GPU_POOL,
    dict(job_image="trace-trainer:1", job_gpus=0),                    # CPU pool: one process, no GPU request
    dict(job_image="trace-trainer:1", job_gpus=8, job_tolerations=[{"key": "a", "operator": "Equal", "value": "b",
                                                                   "effect": "NoExecute", "tolerationSeconds": 60}]),
])
def test_manifest_is_valid_kubernetes_1_32(settings):
    s = TrainerSettings(**settings)
    data = manifest_dict(build_job(wspec(), s, namespace="trace"))
    kubernetes_validate.validate(data, "1.32.0", strict=True)
    pod = data["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    gpus = settings["job_gpus"]
    assert c["command"][:3] == ["torchrun", "--standalone", f"--nproc_per_node={max(1, gpus)}"]
    assert c["command"][-2:] == ["-m", "services.trainer.worker"]
    assert c["resources"]["limits"].get("nvidia.com/gpu") == (str(gpus) if gpus else None)
    assert data["spec"]["backoffLimit"] == s.job_backoff_limit
    assert pod["restartPolicy"] == "Never"
    env = {e["name"]: e for e in c["env"]}
    assert WorkerSpec.model_validate_json(env[SPEC_ENV]["value"]).capability == "precondition_verification"
    assert env["TRACE_TRAINER_CHECKPOINT_URI"]["value"] == "s3://trace-artifacts/runs/r1/adapters/precondition_verification"
    assert c["securityContext"]["allowPrivilegeEscalation"] is False and pod["securityContext"]["runAsNonRoot"]
    if "job_s3_secret_name" in settings:
        assert env["TRACE_TRAINER_S3_SECRET_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "trace-s3",
                                                                                   "key": "secret-key"}
        assert pod["nodeSelector"] == {"trace.dev/pool": "gpu"}
        assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
        assert env["NCCL_DEBUG"]["value"] == "WARN"
        # the environment service's token comes from the auth Secret, never as a value
        assert env[ENVIRONMENT_TOKEN_ENV]["valueFrom"]["secretKeyRef"] == {"name": "trace-auth", "key": "token"}
    else:
        assert ENVIRONMENT_TOKEN_ENV not in env
    assert "secret" not in env[SPEC_ENV]["value"].lower()


def template_job(command: list[str], gpus) -> dict:
    """An operator's Job template whose container runs `command` with `gpus` nvidia.com/gpu (None: no request)."""
    res = {"limits": {"memory": "1Gi"}, "requests": {"memory": "1Gi"}}
    if gpus is not None:
        res["limits"]["nvidia.com/gpu"] = res["requests"]["nvidia.com/gpu"] = gpus
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"generateName": "t-"}, "spec": {"template": {
        "spec": {"restartPolicy": "Never", "containers": [{"name": "train", "image": "trace-trainer:1",
                                                            "command": command, "resources": res}]}}}}


TORCHRUN = ["torchrun", "--standalone", "--nproc-per-node=8", "-m", "services.trainer.worker"]


@pytest.mark.parametrize("kind, template, command, gpus", [
    # the operator's template: adapters keep its processes and GPUs, a gate job gets one of each
    ("TRAINING_KIND_ADAPTER", template_job(TORCHRUN, 8), TORCHRUN, 8),
    ("TRAINING_KIND_GATES", template_job(TORCHRUN, 8), [*TORCHRUN[:2], "--nproc-per-node=1", *TORCHRUN[3:]], 1),
    ("TRAINING_KIND_GATES", template_job(["torchrun", "--nproc_per_node", "4", "-m", "m"], "4"),
     ["torchrun", "--nproc_per_node", "1", "-m", "m"], "1"),                 # the other spelling, a string count
    ("TRAINING_KIND_GATES", template_job(["torchrun", "--nproc_per_node=gpu", "-m", "m"], None),
     ["torchrun", "--nproc_per_node=1", "-m", "m"], None),                   # a CPU template asks for no GPU
    ("TRAINING_KIND_GATES", template_job(["python", "-m", "m"], 1), ["python", "-m", "m"], 1),   # already one
    # the built-in Job (job_gpus=4)
    ("TRAINING_KIND_ADAPTER", None, ["torchrun", "--standalone", "--nproc_per_node=4", "-m",
                                     "services.trainer.worker"], "4"),
    ("TRAINING_KIND_GATES", None, ["torchrun", "--standalone", "--nproc_per_node=1", "-m",
                                   "services.trainer.worker"], "1"),
])
def test_a_gate_job_runs_one_process_on_one_gpu(kind, template, command, gpus):
    """Gate training runs in one process (the worker refuses torchrun ranks): its Job gets one
    process and at most one GPU, while adapter jobs spread over every GPU the Job asks for."""
    spec = wspec().model_copy(update={"kind": kind})
    before = copy.deepcopy(template)
    data = build_job(spec, TrainerSettings(**GPU_POOL), namespace="trace", template=template)
    data = data if isinstance(data, dict) else manifest_dict(data)
    kubernetes_validate.validate(data, "1.32.0", strict=True)
    (c,) = data["spec"]["template"]["spec"]["containers"]
    assert c["command"] == command
    for section in ("limits", "requests"):
        assert c["resources"][section].get("nvidia.com/gpu") == gpus
    assert template == before                     # the operator's template itself is left as it was


@pytest.mark.parametrize("bad, text", [
    (dict(job_tolerations=[{"key": "a", "taint": "x"}]), "unknown fields ['taint']"),
    (dict(job_image_pull_policy="Sometimes"), "Always, IfNotPresent or Never"),
])
def test_bad_settings_say_how_to_fix(bad, text):
    with pytest.raises(ValueError, match=text.replace("[", r"\[").replace("]", r"\]")):
        TrainerSettings(**bad)


def test_missing_image_is_refused():
    with pytest.raises(FailedPrecondition, match="TRACE_TRAINER_JOB_IMAGE"):
        build_job(wspec(), TrainerSettings(), namespace="x")


def test_job_names_are_dns_labels():
    for job_id in ("training-20260101-000000-abcd1234", "X" * 200, "ünïcode"):
        name = job_name(job_id)
        assert len(name) <= 63 and name == name.lower() and name[0].isalpha()


def api_factory(kmock):
    host = str(kmock.url).rstrip("/")
    return lambda: client.ApiClient(client.Configuration(host=host))


async def set_status(batch: client.BatchV1Api, name: str, cond: str, **extra) -> None:
    body = {"status": {"conditions": [{"type": cond, "status": "True", **extra}]}}
    await asyncio.to_thread(batch.patch_namespaced_job_status, name, "trace", body)


async def wait_created(batch, name):
    for _ in range(200):
        try:
            return await asyncio.to_thread(batch.read_namespaced_job, name, "trace")
        except client.ApiException:
            await asyncio.sleep(0.05)
    raise AssertionError("the Job was never created")


@pytest.mark.asyncio
async def test_executor_create_watch_succeed(kmock, tmp_path):
    store = open_store(tmp_path.as_uri())
    settings = TrainerSettings(kubernetes_namespace="trace", job_poll_seconds=0.05, **GPU_POOL)
    ex = KubernetesExecutor(settings, store, api_factory(kmock))
    spec = wspec(root=tmp_path.as_uri())
    seen = []
    task = asyncio.create_task(ex.run(spec, seen.append))
    job = await wait_created(ex.batch, job_name(spec.job_id))
    assert job.spec.template.spec.containers[0].resources.limits["nvidia.com/gpu"] == "4"
    sink = EventSink(store=store, key=spec.events_key, min_interval_s=0)   # what the pod's worker writes
    for it in (1, 2):
        sink.emit("iteration", {"iteration": it, "values": {"reward_mean": 0.1 * it}})
    sink.emit("checkpoint", {"iteration": 2, "uri": "file:///x", "sha256": "0" * 64, "size": 1})
    sink.emit("result", {"iterations": 2, "policy_version": 2, "stop_reason": "completed", "adapter_uri": "u",
                         "outputs": []})
    await set_status(ex.batch, job.metadata.name, "Complete")
    result = await asyncio.wait_for(task, 10)
    assert result["stop_reason"] == "completed"
    assert [e["event"] for e in seen] == ["iteration", "iteration", "checkpoint"]


@pytest.mark.asyncio
@pytest.mark.parametrize("failing_reads, outcome", [
    (STATE_READ_TRIES - 1, "completed"),    # an API server restarting: asked again, the run goes on
    (10**6, "unavailable"),                 # never answers: the run gives up and deletes the Job
])
async def test_failed_state_reads_are_retried_then_the_job_is_deleted(kmock, tmp_path, monkeypatch, failing_reads,
                                                                      outcome):
    store = open_store(tmp_path.as_uri())
    ex = KubernetesExecutor(TrainerSettings(kubernetes_namespace="trace", job_poll_seconds=0.05, job_image="i:1"),
                            store, api_factory(kmock))
    real, calls = ex._state, []

    def flaky(name, ns):
        calls.append(name)
        if len(calls) <= failing_reads:
            raise Unavailable(f"cannot read Kubernetes Job {name}: 503 Service Unavailable")
        return real(name, ns)

    monkeypatch.setattr(ex, "_state", flaky)
    spec = wspec(root=tmp_path.as_uri())
    task = asyncio.create_task(ex.run(spec, lambda e: None))
    job = await wait_created(ex.batch, job_name(spec.job_id))
    if outcome == "completed":
        EventSink(store=store, key=spec.events_key, min_interval_s=0).emit(
            "result", {"iterations": 1, "policy_version": 1, "stop_reason": "completed", "adapter_uri": "u",
                       "outputs": []})
        await set_status(ex.batch, job.metadata.name, "Complete")
        assert (await asyncio.wait_for(task, 10))["stop_reason"] == "completed"
        assert len(calls) > failing_reads
        return
    with pytest.raises(Unavailable, match=f"{STATE_READ_TRIES} reads in a row failed; the Job is deleted"):
        await asyncio.wait_for(task, 10)
    assert len(calls) == STATE_READ_TRIES
    with pytest.raises(client.ApiException) as err:
        await asyncio.to_thread(ex.batch.read_namespaced_job, job.metadata.name, "trace")
    assert err.value.status == 404


def test_an_api_server_that_does_not_answer_is_unavailable(tmp_path):
    """No HTTP answer at all (refused, reset) is a failed read like a 503, retried by run(), not an escape."""
    from tests.support.ports import closed_port

    host = f"http://127.0.0.1:{closed_port()}"
    config = client.Configuration(host=host)
    config.retries = 0
    ex = KubernetesExecutor(TrainerSettings(kubernetes_namespace="trace", job_image="i:1"),
                            open_store(tmp_path.as_uri()), lambda: client.ApiClient(config))
    with pytest.raises(Unavailable, match="cannot read Kubernetes Job j: "):
        ex._state("j", "trace")


async def add_pod(core: client.CoreV1Api, job_id: str, n: int, terminated: dict) -> None:
    """A pod as the Job controller would create it from the template (our labels), ended as `terminated`."""
    pod = {"metadata": {"name": f"p{n}", "labels": {"trace.dev/training-job": job_id}},
           "spec": {"containers": [{"name": "trainer", "image": "i:1"}]}}
    await asyncio.to_thread(core.create_namespaced_pod, "trace", pod)
    status = {"status": {"phase": "Failed", "containerStatuses": [
        {"name": "trainer", "image": "i:1", "imageID": "", "ready": False, "restartCount": 0,
         "state": {"terminated": terminated}}]}}
    await asyncio.to_thread(core.patch_namespaced_pod_status, f"p{n}", "trace", status)


@pytest.mark.asyncio
@pytest.mark.parametrize("events, pods, condition, error, text", [
    ([("error", {"code": "RESOURCE_EXHAUSTED", "message": "CUDA out of memory"})], [],
     {"reason": "BackoffLimitExceeded"}, ResourceExhausted, "CUDA out of memory"),
    ([], [], {"reason": "DeadlineExceeded", "message": "Job was active longer than specified deadline"}, Exception,
     "DeadlineExceeded"),
    # killed from outside: no error event, the pods say why, and the error says what to change
    ([], [{"reason": "OOMKilled", "exitCode": 137}, {"reason": "OOMKilled", "exitCode": 137}],
     {"reason": "BackoffLimitExceeded"}, Exception,
     r"ended: OOMKilled \(exit 137\), OOMKilled \(exit 137\)\. OOMKilled: .*\(48Gi\)\. Raise TRACE_TRAINER_JOB_MEMORY"),
    ([], [{"reason": "Error", "exitCode": 1}], {"reason": "BackoffLimitExceeded"}, Exception,
     r"BackoffLimitExceeded; its pods' trainer containers ended: Error \(exit 1\)$"),
])
async def test_executor_failed_job_reports_the_reason(kmock, tmp_path, events, pods, condition, error, text):
    store = open_store(tmp_path.as_uri())
    ex = KubernetesExecutor(TrainerSettings(kubernetes_namespace="trace", job_poll_seconds=0.05, job_image="i:1",
                                            job_memory="48Gi"),
                            store, api_factory(kmock))
    spec = wspec(root=tmp_path.as_uri())
    task = asyncio.create_task(ex.run(spec, lambda e: None))
    job = await wait_created(ex.batch, job_name(spec.job_id))
    sink = EventSink(store=store, key=spec.events_key, min_interval_s=0)
    for kind, payload in events:
        sink.emit(kind, payload)
    for n, terminated in enumerate(pods):
        await add_pod(ex.core, spec.job_id, n, terminated)
    await add_pod(ex.core, "another-job", 99, {"reason": "OOMKilled", "exitCode": 137})   # not this Job's pod
    await set_status(ex.batch, job.metadata.name, "Failed", **condition)
    with pytest.raises(error, match=text):
        await asyncio.wait_for(task, 10)


@pytest.mark.asyncio
async def test_a_cancel_while_the_job_is_being_created_deletes_it(kmock, tmp_path):
    """The create call runs in a thread: a cancel that lands while it is on its way used to leave the Job
    it then made running, with nothing to delete it."""
    ex = KubernetesExecutor(TrainerSettings(kubernetes_namespace="trace", job_poll_seconds=0.05, job_image="i:1"),
                            open_store(tmp_path.as_uri()), api_factory(kmock))
    spec = wspec(root=tmp_path.as_uri())
    real_create, started = ex.batch.create_namespaced_job, threading.Event()

    def slow_create(*args, **kwargs):
        started.set()
        time.sleep(0.5)
        return real_create(*args, **kwargs)

    ex.batch.create_namespaced_job = slow_create
    task = asyncio.create_task(ex.run(spec, lambda e: None))
    assert await asyncio.to_thread(started.wait, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(client.ApiException) as err:   # made after the cancel, and deleted
        await asyncio.to_thread(ex.batch.read_namespaced_job, job_name(spec.job_id), "trace")
    assert err.value.status == 404


@pytest.mark.asyncio
async def test_training_job_cancel_deletes_the_kubernetes_job(kmock, tmp_path):
    settings = TrainerSettings(artifact_root=tmp_path.as_uri(), kubernetes_namespace="trace", job_poll_seconds=0.05,
                               **GPU_POOL)
    domain = Training(settings, kube_api_client=api_factory(kmock))
    spec = TrainingSpecModel.model_validate(dict(
        kind="TRAINING_KIND_ADAPTER", capability="precondition_verification",
        environments=[{"name": "store", "params": {"task_types": "precondition_check"}}],
        policy={"backend": "POLICY_BACKEND_IN_PROCESS", "model": "micro"}, config={"max_steps": 50},
        executor="EXECUTOR_KUBERNETES"))
    rec = domain.create_job(spec, "r1", {}, "")
    batch = domain.kube_executor().batch
    name = job_name(rec.job_id)
    await wait_created(batch, name)
    store = domain.store
    sink = EventSink(store=store, key=events_key_for("runs/r1/adapters/precondition_verification", rec.job_id),
                     min_interval_s=0)
    sink.emit("iteration", {"iteration": 1, "values": {"reward_mean": 0.25, "informative_group_fraction": 0.5}})
    for _ in range(200):
        if domain.jobs.get(rec.job_id).completed == 1:
            break
        await asyncio.sleep(0.05)
    assert domain.jobs.get(rec.job_id).metrics["reward_mean"] == 0.25
    # one live job per checkpoint prefix: the same run + capability is refused while this one runs
    for request_id in ("", "another-request"):
        with pytest.raises(FailedPrecondition, match=f"{rec.job_id} is already training runs/r1/adapters/"
                                                     "precondition_verification"):
            domain.create_job(spec, "r1", {}, request_id)
    domain.jobs.cancel(rec.job_id)
    final = await domain.jobs.wait(rec.job_id, 10)
    assert final.state == JobState.CANCELLED
    with pytest.raises(client.ApiException) as err:
        for _ in range(100):
            await asyncio.to_thread(batch.read_namespaced_job, name, "trace")
            await asyncio.sleep(0.05)
    assert err.value.status == 404
    # once it has ended, a new job may take the prefix over (and resume from its checkpoints); a retried
    # request gets its own job back rather than being refused as a second writer
    again = domain.create_job(spec, "r1", {}, "req-1")
    assert domain.create_job(spec, "r1", {}, "req-1").job_id == again.job_id
    domain.jobs.cancel(again.job_id)
    assert (await domain.jobs.wait(again.job_id, 10)).state == JobState.CANCELLED


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["uri", "params"])
async def test_the_job_pod_gets_the_data_directory_the_trainer_resolved(kmock, tmp_path, how):
    """A tau2 data directory named through a symlink that resolves under a data root: the Job pod's
    WorkerSpec carries the resolved directory (what the trainer checked), never the request's path."""
    tau2 = require_tau2_data().resolve()
    (tmp_path / "link").symlink_to(tau2 / "retail")
    settings = TrainerSettings(artifact_root=(tmp_path / "store").as_uri(), kubernetes_namespace="trace",
                               job_poll_seconds=0.05, data_roots=[str(tau2)], **GPU_POOL)
    domain = Training(settings, kube_api_client=api_factory(kmock))
    named = {"uri": (tmp_path / "link").as_uri()} if how == "uri" else {"params": {"data": str(tmp_path / "link")}}
    spec = TrainingSpecModel.model_validate(dict(
        kind="TRAINING_KIND_ADAPTER", capability="precondition_verification",
        environments=[{"name": "tau2-retail", **named}], policy={"backend": "POLICY_BACKEND_IN_PROCESS",
                                                                "model": "micro"},
        config={"max_steps": 5}, executor="EXECUTOR_KUBERNETES"))
    rec = domain.create_job(spec, "r1", {}, "")
    job = await wait_created(domain.kube_executor().batch, job_name(rec.job_id))
    env = {e.name: e.value for e in job.spec.template.spec.containers[0].env}
    sent = WorkerSpec.model_validate_json(env[SPEC_ENV]).environment
    assert sent["params"]["data"] == str(tau2 / "retail")
    assert str(tmp_path / "link") not in env[SPEC_ENV]
    domain.jobs.cancel(rec.job_id)
    assert (await domain.jobs.wait(rec.job_id, 10)).state == JobState.CANCELLED
