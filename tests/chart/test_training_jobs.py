"""The training Job the trainer creates in a cluster is the chart's (training-job.json, read through
TRACE_TRAINER_JOB_TEMPLATE) with only the job's own fields added, and vLLM rollouts under the
Kubernetes executor are allowed exactly when the chart shares an adapter claim between the vLLM
server and the Jobs. Real pieces: the helm render, the trainer's settings loaded from the rendered
env, its validation and Job builder, the Kubernetes 1.32 schema (strict)."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest

from services.trainer.jobspec import SPEC_ENV, WorkerSpec, events_key_for
from services.trainer.kubernetes_job import LABEL_JOB, build_job, job_name
from services.trainer.service import Training
from services.trainer.settings import TrainerSettings
from services.trainer.specs import TrainingSpecModel
from tests.chart.helm import FULLNAME, KUBE_VERSION, NAMESPACE, render
from trace_common.errors import FailedPrecondition


def trainer_settings(value_set: str, tmp_path, monkeypatch) -> TrainerSettings:
    """The trainer's settings as its pod loads them from the rendered env, the Job template written
    where TRACE_TRAINER_JOB_TEMPLATE points (the mounted ConfigMap) -- here, a temp file."""
    r = render(value_set)
    (c,) = r.get("Deployment", f"{FULLNAME}-trainer")["spec"]["template"]["spec"]["containers"]
    template = tmp_path / "training-job.json"
    template.write_text(r.get("ConfigMap", f"{FULLNAME}-workload-templates")["data"]["training-job.json"])
    for e in c["env"]:
        if e["name"].startswith("TRACE_TRAINER_"):
            value = NAMESPACE if "fieldRef" in e.get("valueFrom", {}) else e.get("value", "from-secret")
            monkeypatch.setenv(e["name"], value)
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["TRACE_TRAINER_JOB_TEMPLATE"] == "/etc/trace/templates/training-job.json"
    monkeypatch.setenv("TRACE_TRAINER_JOB_TEMPLATE", str(template))
    monkeypatch.setenv("TRACE_TRAINER_ARTIFACT_ROOT", tmp_path.as_uri())   # checked at startup: a local root
    return TrainerSettings()


def worker_spec() -> WorkerSpec:
    prefix = "runs/r1/adapters/precondition_verification"
    job_id = "training-20261202-000000-abcd1234"
    return WorkerSpec(job_id=job_id, run_id="r1", capability="precondition_verification",
                      environment={"name": "store", "version": "", "uri": "", "params": {}},
                      policy={"backend": "POLICY_BACKEND_IN_PROCESS", "model": "micro"}, config={"max_steps": 3},
                      artifact_root="s3://trace-artifacts", prefix=prefix, events_key=events_key_for(prefix, job_id))


@pytest.mark.parametrize("value_set, gpus, pool", [
    ("defaults", 1, None),
    ("gpu-pools", 8, {"trace.example.com/pool": "train"}),
])
def test_the_trainer_builds_its_jobs_from_the_chart_template(value_set, gpus, pool, tmp_path, monkeypatch):
    settings = trainer_settings(value_set, tmp_path, monkeypatch)
    job = build_job(worker_spec(), settings, namespace=NAMESPACE)
    kubernetes_validate.validate(job, KUBE_VERSION, strict=True)
    assert job["metadata"]["name"] == job_name(worker_spec().job_id) and "generateName" not in job["metadata"]
    pod = job["spec"]["template"]
    assert pod["metadata"]["labels"][LABEL_JOB] == "training-20261202-000000-abcd1234"   # how its pods are found
    assert pod["metadata"]["labels"]["app.kubernetes.io/name"] == "trace"    # the chart's own, kept
    rules = {r["action"]: r for r in job["spec"]["podFailurePolicy"]["rules"]}
    assert rules["FailJob"]["onExitCodes"] == {"containerName": "train", "operator": "In", "values": [1]}
    assert rules["Ignore"]["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]
    (c,) = pod["spec"]["containers"]
    assert c["command"][-2:] == ["-m", "services.trainer.worker"]       # a module that exists
    __import__(c["command"][-1])
    assert c["resources"]["limits"]["nvidia.com/gpu"] == gpus           # the chart's, not the job_* settings'
    if pool:
        assert pod["spec"]["nodeSelector"] == pool and pod["spec"]["tolerations"][0]["value"] == "train"
    env = {e["name"]: e for e in c["env"]}
    assert [e["name"] for e in c["env"]].count(SPEC_ENV) == 1
    assert WorkerSpec.model_validate_json(env[SPEC_ENV]["value"]).capability == "precondition_verification"
    assert env["TRACE_TRAINER_S3_SECRET_KEY"]["valueFrom"]["secretKeyRef"]["name"]   # the chart's Secret reference
    assert env["TRACE_TRAINER_ENVIRONMENT_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == f"{FULLNAME}-auth"
    assert "secret" not in env[SPEC_ENV]["value"].lower()


def vllm_job() -> TrainingSpecModel:
    return TrainingSpecModel.model_validate(dict(
        kind="TRAINING_KIND_ADAPTER", capability="precondition_verification", executor="EXECUTOR_KUBERNETES",
        environments=[{"name": "store", "params": {"task_types": "precondition_check"}}],
        policy={"backend": "POLICY_BACKEND_IN_PROCESS", "model": "micro"},
        config={"max_steps": 2, "rollout_backend": "vllm", "vllm": {"profile": "vllm", "adapter_dir": "cap"}}))


@pytest.mark.parametrize("value_set, allowed", [("defaults", False), ("gpu-pools", True)])
def test_vllm_rollouts_under_kubernetes_need_the_shared_adapter_claim(value_set, allowed, tmp_path, monkeypatch):
    r = render(value_set)
    settings = trainer_settings(value_set, tmp_path, monkeypatch)
    training = Training(settings)
    if not allowed:
        with pytest.raises(FailedPrecondition, match="vllm.adapterVolume.existingClaim"):
            training.validate(vllm_job())
        return
    config = training.validate(vllm_job())
    assert config.vllm.adapter_dir == "/shared/adapters/cap"
    assert config.vllm.base_url == f"http://{FULLNAME}-vllm:8000/v1"
    # the vLLM server reads the same claim at the same path
    spec = r.get("Deployment", f"{FULLNAME}-vllm")["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "adapters")
    assert mount == {"name": "adapters", "mountPath": "/shared/adapters", "readOnly": True}
    volume = next(v for v in spec["volumes"] if v["name"] == "adapters")
    job = json.loads(r.get("ConfigMap", f"{FULLNAME}-workload-templates")["data"]["training-job.json"])
    job_volume = next(v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "adapters")
    assert volume["persistentVolumeClaim"]["claimName"] == job_volume["persistentVolumeClaim"]["claimName"] \
        == "trace-adapters"
