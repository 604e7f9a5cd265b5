"""The token the trainer and its local workers send to the environment service, and the request
parameters it refuses before any environment is made."""

from __future__ import annotations

import pytest

from services.trainer.executors import LocalExecutor
from services.trainer.jobspec import ENVIRONMENT_TLS_CA_ENV, ENVIRONMENT_TOKEN_ENV
from services.trainer.service import Training
from services.trainer.settings import TrainerSettings, environment_token
from services.trainer.specs import TrainingSpecModel
from trace_common.errors import FailedPrecondition, PermissionDenied


@pytest.mark.parametrize("settings, expected", [
    ({}, None),                                                     # no auth anywhere
    ({"auth_token": "trainer-tok"}, "trainer-tok"),                 # one shared Secret (the chart)
    ({"auth_token": "trainer-tok", "environment_token": "env-tok"}, "env-tok"),  # per-service tokens (tracectl up)
    ({"environment_token": "env-tok"}, "env-tok"),
])
def test_environment_token_and_the_local_workers_env(tmp_path, settings, expected):
    s = TrainerSettings(artifact_root=tmp_path.as_uri(), work_dir=str(tmp_path / "work"), **settings)
    assert environment_token(s) == expected
    env = LocalExecutor(s).child_env()
    assert env.get(ENVIRONMENT_TOKEN_ENV) == expected


@pytest.mark.parametrize("ca", [None, "/etc/trace/tls/ca.crt"])
def test_the_local_workers_get_the_environment_services_ca(tmp_path, monkeypatch, ca):
    monkeypatch.delenv(ENVIRONMENT_TLS_CA_ENV, raising=False)
    s = TrainerSettings(artifact_root=tmp_path.as_uri(), work_dir=str(tmp_path / "work"), environment_tls_ca_file=ca)
    assert LocalExecutor(s).child_env().get(ENVIRONMENT_TLS_CA_ENV) == ca


def test_the_built_in_kubernetes_job_refuses_a_ca_it_cannot_mount(tmp_path):
    from services.trainer.jobspec import WorkerSpec
    from services.trainer.kubernetes_job import build_job

    s = TrainerSettings(artifact_root=tmp_path.as_uri(), job_image="trace-trainer:1",
                        environment_tls_ca_file="/etc/trace/tls/ca.crt")
    spec = WorkerSpec(job_id="training-20260101-000000-abcd1234", run_id="r1", capability="c",
                      environment={"name": "store", "version": "", "uri": "", "params": {}},
                      policy={"backend": "POLICY_BACKEND_IN_PROCESS", "model": "micro"}, config={},
                      artifact_root=tmp_path.as_uri(), prefix="runs/r1/adapters/c")
    with pytest.raises(FailedPrecondition, match="give a Job template that mounts it"):
        build_job(spec, s, namespace="trace")


@pytest.mark.parametrize("param", ["user_base_url", "user_api_key", "auth_token"])
def test_environment_params_that_choose_an_url_or_key_are_refused(tmp_path, param):
    domain = Training(TrainerSettings(artifact_root=tmp_path.as_uri(), work_dir=str(tmp_path / "work")))
    spec = TrainingSpecModel(kind="TRAINING_KIND_ADAPTER", capability="pick_skill",
                             environments=[{"name": "store", "params": {param: "http://127.0.0.1:9/v1"}}],
                             policy={"backend": "POLICY_BACKEND_IN_PROCESS", "model": "micro"}, config={"max_steps": 1})
    with pytest.raises(PermissionDenied, match=param):
        domain.validate(spec)
