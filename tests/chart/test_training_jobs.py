"""The training Job the trainer creates in a cluster is the chart's (training-job.json, read through
TRACE_TRAINER_JOB_TEMPLATE) with only the job's own fields added, and vLLM rollouts under the
Kubernetes executor are allowed exactly when the chart shares an adapter claim between the vLLM
server and the Jobs. Real pieces: the helm render, the trainer's settings loaded from the rendered
env, its validation and Job builder, the Kubernetes 1.32 schema (strict)."""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest

from services.trainer.jobspec import ENVIRONMENT_TLS_CA_ENV, SPEC_ENV, WorkerSpec, events_key_for
from services.trainer.kubernetes_job import LABEL_JOB, build_job, job_name
from services.trainer.service import Training
from services.trainer.settings import TrainerSettings
from services.trainer.specs import TrainingSpecModel
from tests.chart.helm import FULLNAME, KUBE_VERSION, NAMESPACE, render
from tests.support.tls import self_signed
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
            if e["name"].endswith(("_TLS_CERT_FILE", "_TLS_KEY_FILE")):   # the mounted Secret's files, stood in for
                cert, key = self_signed(tmp_path)
                value = str(cert if e["name"].endswith("_CERT_FILE") else key)
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


@pytest.mark.parametrize("value_set, ca", [("tls", "/etc/trace/tls/ca.crt"), ("defaults", None)])
def test_with_tls_the_trainer_and_its_jobs_trust_the_environment_services_ca(value_set, ca, tmp_path, monkeypatch):
    """With tls.enabled the environment service serves TLS only: the trainer and its Jobs' workers open
    their channel to it trusting tls.caKey of the TLS Secret, mounted in the Job without the private key."""
    settings = trainer_settings(value_set, tmp_path, monkeypatch)
    assert settings.environment_tls_ca_file == (None if ca is None else Path(ca))
    job = build_job(worker_spec(), settings, namespace=NAMESPACE)
    kubernetes_validate.validate(job, KUBE_VERSION, strict=True)
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env.get(ENVIRONMENT_TLS_CA_ENV) == ca
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    if ca is None:
        assert "/etc/trace/tls" not in mounts
        return
    mount = mounts[str(Path(ca).parent)]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "trace-grpc-tls"            # tests/chart/values/tls.yaml
    assert volume["secret"]["items"] == [{"key": "ca.crt", "path": Path(ca).name}]   # no tls.key in a Job
    assert volume["secret"]["optional"] is True   # a Secret without ca.crt must not keep every Job from starting


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
