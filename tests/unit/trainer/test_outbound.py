"""The trainer's vLLM rollouts stay inside what the operator allows (`services/trainer/outbound.py`):
the server is a TRACE_TRAINER_ENDPOINTS profile, adapter versions go inside
TRACE_TRAINER_VLLM_ADAPTER_ROOT, and an adapter job's HTTP-served base agent trains only on them.
Each refusal happens in `validate`, before a job exists and before anything connects (a listener on
loopback sees nothing)."""

from __future__ import annotations

import json
import os

import pytest
from pydantic import ValidationError

from services.trainer.service import Training
from services.trainer.settings import TrainerSettings
from services.trainer.specs import TrainingSpecModel
from tests.support.endpoints import Listener
from tests.unit.trainer.grpo.helpers import tiny_model
from trace_common.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied

PROFILE_URL = "http://vllm.internal:8000/v1"


@pytest.fixture
def listener():
    """The loopback server that counts every connection (tests/support/endpoints.py)."""
    with Listener() as srv:
        yield srv


def spec(vllm: dict) -> TrainingSpecModel:
    return TrainingSpecModel.model_validate(dict(
        kind="TRAINING_KIND_ADAPTER", capability="precondition_verification",
        environments=[{"name": "store", "params": {"task_types": "precondition_check"}}],
        policy={"backend": "POLICY_BACKEND_IN_PROCESS", "model": "micro"},
        config={"max_steps": 2, "rollout_backend": "vllm", "vllm": vllm}))


@pytest.fixture
def domain(tmp_path):
    root = tmp_path / "adapters"
    root.mkdir()
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", root / "escape")
    settings = TrainerSettings(artifact_root=tmp_path.as_uri(), vllm_adapter_root=str(root),
                               endpoints={"vllm": {"base_url": PROFILE_URL}})
    return Training(settings), root


@pytest.mark.parametrize(("vllm", "error", "fragments"), [
    # a URL of the request's own: refused, naming the field and the configured profiles
    ({"base_url": "LISTENER", "adapter_dir": "a"}, PermissionDenied,
     ["spec.config.vllm.base_url", "not an endpoint the operator allows", "vllm (http://vllm.internal:8000/v1)",
      "TRACE_TRAINER_ENDPOINTS"]),
    ({"profile": "other", "adapter_dir": "a"}, PermissionDenied, ["spec.config.vllm.profile", "'other'"]),
    ({"profile": "vllm", "base_url": "LISTENER", "adapter_dir": "a"}, PermissionDenied,
     ["spec.config.vllm.base_url", "not the base_url of profile 'vllm'"]),
    ({"profile": "Bad Name", "adapter_dir": "a"}, InvalidArgument, ["spec.config.vllm.profile"]),
    # a directory outside the operator's root: absolute, '..', or a symlink out of it
    ({"profile": "vllm", "adapter_dir": "/etc/cron.d"}, PermissionDenied,
     ["spec.config.vllm.adapter_dir", "outside the trainer's adapter root"]),
    ({"profile": "vllm", "adapter_dir": "../elsewhere"}, PermissionDenied, ["spec.config.vllm.adapter_dir"]),
    ({"profile": "vllm", "adapter_dir": "escape/x"}, PermissionDenied, ["spec.config.vllm.adapter_dir"]),
    ({"profile": "vllm", "adapter_dir": "a\x00b"}, InvalidArgument, ["spec.config.vllm.adapter_dir", "NUL"]),
])
def test_a_job_cannot_choose_the_server_or_the_adapter_directory(domain, listener, vllm, error, fragments):
    training, _ = domain
    vllm = {k: (listener.base_url if v == "LISTENER" else v) for k, v in vllm.items()}
    with pytest.raises(error) as err:
        training.validate(spec(vllm))
    for fragment in fragments:
        assert fragment in str(err.value)
    assert listener.connections == 0
    assert training.jobs.list()[0] == []


SERVED = "MODELS/qwen3-tiny"          # a served name that is also a model directory under a model root
VLLM = {"profile": "vllm", "adapter_dir": "cap"}
HTTP, IN_PROCESS = "POLICY_BACKEND_OPENAI_HTTP", "POLICY_BACKEND_IN_PROCESS"


@pytest.fixture
def served(tmp_path):
    """A trainer with an endpoint profile, an adapter root and a model root holding a tiny model
    directory (what the vLLM server would serve and the trainer loads)."""
    root, models = tmp_path / "adapters", tmp_path / "models"
    root.mkdir()
    tiny_model().save_pretrained(models / "qwen3-tiny")
    (models / "no-config").mkdir()
    settings = TrainerSettings(artifact_root=(tmp_path / "store").as_uri(), vllm_adapter_root=str(root),
                               model_roots=[models.as_uri()], endpoints={"vllm": {"base_url": PROFILE_URL}})
    return Training(settings), models


@pytest.mark.parametrize(("policy", "config", "error", "fragments"), [
    ({"backend": IN_PROCESS, "model": "micro"}, {}, None, []),
    ({"backend": IN_PROCESS, "model": "micro"}, {"rollout_backend": "vllm", "vllm": VLLM}, None, []),
    # the base agent served by the vLLM server the adapters roll out on: the trainer loads its weights
    ({"backend": HTTP, "model": SERVED}, {"rollout_backend": "vllm", "vllm": VLLM}, None, []),
    ({"backend": HTTP, "model": SERVED, "endpoint": PROFILE_URL + "/"}, {"rollout_backend": "vllm", "vllm": VLLM},
     None, []),
    ({"backend": HTTP, "model": SERVED, "endpoint": PROFILE_URL}, {}, InvalidArgument,
     ["spec.policy.backend", "rollouts from the vLLM server", "config.rollout_backend='vllm'",
      "config.vllm={'profile'"]),
    ({"backend": "POLICY_BACKEND_SCRIPTED", "model": "expert"}, {"rollout_backend": "vllm", "vllm": VLLM},
     InvalidArgument, ["spec.policy.backend", "POLICY_BACKEND_IN_PROCESS"]),
    # a served name the trainer cannot load: a Hugging Face id, a directory that is no model
    ({"backend": HTTP, "model": "Qwen/Qwen3-30B-A3B-Instruct-2507"}, {"rollout_backend": "vllm", "vllm": VLLM},
     PermissionDenied, ["spec.policy.model: 'Qwen/Qwen3-30B-A3B-Instruct-2507' is the served model name",
                        "loads the weights of an HTTP-served base agent itself", "a model location the trainer may "
                        "read", "TRACE_TRAINER_MODEL_ROOTS"]),
    ({"backend": HTTP, "model": "MODELS/no-config"}, {"rollout_backend": "vllm", "vllm": VLLM}, NotFound,
     ["spec.policy.model", "has no config.json", "loads the weights of an HTTP-served base agent itself"]),
    # the served base agent on another server than the one the adapters train against (never called)
    ({"backend": HTTP, "model": SERVED, "endpoint": "LISTENER"}, {"rollout_backend": "vllm", "vllm": VLLM},
     InvalidArgument, ["spec.policy.endpoint", f"expected the server the adapters' rollouts use, {PROFILE_URL}",
                       "same server"]),
])
def test_an_adapter_job_trains_an_http_base_agent_only_with_vllm_rollouts(served, listener, policy, config, error,
                                                                           fragments):
    """POLICY_BACKEND_OPENAI_HTTP is accepted exactly when the job rolls out through vLLM; its served
    name must be a model the trainer may load, its endpoint (when set) the trainer's vLLM profile."""
    training, models = served
    policy = {k: v.replace("MODELS", str(models)).replace("LISTENER", listener.base_url) for k, v in policy.items()}
    job = TrainingSpecModel.model_validate(dict(
        kind="TRAINING_KIND_ADAPTER", capability="precondition_verification",
        environments=[{"name": "store", "params": {"task_types": "precondition_check"}}],
        policy=policy, config={"max_steps": 2, **config}))
    if error is None:
        got = training.validate(job)
        assert got.rollout_backend == config.get("rollout_backend", "in_process")
        if got.rollout_backend == "vllm":
            assert got.vllm.base_url == PROFILE_URL
    else:
        with pytest.raises(error) as err:
            training.validate(job)
        for fragment in fragments:
            assert fragment in str(err.value)
    assert listener.connections == 0
    assert training.jobs.list()[0] == []


@pytest.mark.parametrize(("vllm", "base_url", "sub"), [
    ({"profile": "vllm", "adapter_dir": "cap"}, PROFILE_URL, "cap"),             # the profile decides the URL
    ({"base_url": PROFILE_URL + "/", "adapter_dir": "cap/v"}, PROFILE_URL, "cap/v"),  # its exact base_url
    ({"profile": "vllm", "adapter_dir": "ROOT/abs"}, PROFILE_URL, "abs"),        # absolute, inside the root
])
def test_an_allowed_server_and_directory_are_resolved_for_the_worker(domain, vllm, base_url, sub):
    training, root = domain
    vllm = {k: v.replace("ROOT", str(root)) for k, v in vllm.items()}
    config = training.validate(spec(vllm))
    assert config.vllm.base_url == base_url and config.vllm.profile == "vllm"
    assert config.vllm.adapter_dir == os.path.join(root, sub)


@pytest.mark.parametrize("executor", ["EXECUTOR_LOCAL", None])
def test_the_config_check_applies_the_same_rules(domain, listener, executor):
    """ValidateTrainingConfig (a run's pre-flight) told the executor refuses what CreateTrainingJob
    would under it, naming the caller's field, and returns what the job would train with; not told,
    it parses the fields only (the caller asks a trainer that will not run the jobs)."""
    training, root = domain
    values = {"rollout_backend": "vllm", "vllm": {"base_url": listener.base_url, "adapter_dir": "a"}}
    if executor is None:
        assert training.validate_config("TRAINING_KIND_ADAPTER", values, "training.grpo").vllm.adapter_dir == "a"
    else:
        with pytest.raises(PermissionDenied, match="training.grpo.vllm.base_url"):
            training.validate_config("TRAINING_KIND_ADAPTER", values, "training.grpo", executor=executor)
    assert listener.connections == 0
    ok = training.validate_config("TRAINING_KIND_ADAPTER", {"rollout_backend": "vllm", "vllm": {
        "profile": "vllm", "adapter_dir": "a"}}, "training.grpo", executor=executor)
    if executor:
        assert ok.vllm.base_url == PROFILE_URL and ok.vllm.adapter_dir == str(root / "a")
    else:
        assert ok.vllm.base_url == "" and ok.vllm.adapter_dir == "a"


def job_template(volume: dict | None, mount: dict | None) -> dict:
    """A training Job template whose container mounts `volume` (named "shared") as `mount` says."""
    pod = {"containers": [{"name": "train", "image": "trace-trainer:1", "command": ["torchrun"],
                           "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}],
           "volumes": [{"name": "tmp", "emptyDir": {}}]}
    if volume is not None:
        pod["volumes"].append({"name": "shared", **volume})
        pod["containers"][0]["volumeMounts"].append({"name": "shared", **(mount or {})})
    return {"apiVersion": "batch/v1", "kind": "Job", "spec": {"template": {"spec": pod}}}


PVC = {"persistentVolumeClaim": {"claimName": "trace-adapters"}}


@pytest.mark.parametrize(("template", "allowed", "why"), [
    (None, False, "durable mounts: none"),                                          # the built-in Job
    (job_template(None, None), False, "durable mounts: none"),
    (job_template({"emptyDir": {}}, {"mountPath": "/adapters"}), False, "durable mounts: none"),   # dies with the pod
    (job_template({}, {"mountPath": "/adapters"}), False, "durable mounts: none"),   # no source: an emptyDir
    (job_template(PVC, {"mountPath": "/adapters", "readOnly": True}), False, "durable mounts: none"),
    (job_template(PVC, {"mountPath": "/elsewhere"}), False, "durable mounts: /elsewhere"),
    (job_template({"persistentVolumeClaim": {"claimName": "c", "readOnly": True}}, {"mountPath": "/adapters"}),
     False, "durable mounts: none"),                                               # the claim is read-only
    (job_template({"hostPath": {"path": "/srv"}}, {"mountPath": "/adapters"}), False, "durable mounts: none"),
    (job_template(PVC, {"mountPath": "/adapters", "subPath": "x"}), False, "durable mounts: none"),  # another dir
    (job_template(PVC, {"mountPath": "/adapters/sub"}), False, "durable mounts: /adapters/sub"),  # below the root
    (job_template(PVC, {"mountPath": "/adapters"}), True, ""),
    (job_template(PVC, {"mountPath": "/"}), True, ""),                              # above the root holds it
    (job_template({"nfs": {"server": "nfs", "path": "/x"}}, {"mountPath": "/adapters"}), True, ""),
])
def test_kubernetes_jobs_roll_out_on_vllm_only_with_the_root_on_a_shared_volume(tmp_path, template, allowed, why):
    """Under the Kubernetes executor the Job's container must mount the adapter root on a volume that
    outlives the pod and is writable (the vLLM server reads the same claim), as its template says."""
    settings = dict(artifact_root=tmp_path.as_uri(), vllm_adapter_root="/adapters", job_image="trace-trainer:1",
                    endpoints={"vllm": {"base_url": PROFILE_URL}})
    if template is not None:
        (tmp_path / "job.json").write_text(json.dumps(template))
        settings["job_template"] = str(tmp_path / "job.json")
    training = Training(TrainerSettings(**settings))
    job = spec({"profile": "vllm", "adapter_dir": "cap"}).model_copy(update={"executor": "EXECUTOR_KUBERNETES"})
    # the job, and its config alone as ValidateTrainingConfig checks it for this executor: the same verdict
    for check in (lambda: training.validate(job),
                  lambda: training.validate_config(job.kind, job.config, "training.grpo", executor=job.executor)):
        if allowed:
            assert check().vllm.adapter_dir == "/adapters/cap"
        else:
            with pytest.raises(FailedPrecondition, match="Kubernetes executor") as err:
                check()
            assert why in str(err.value) and "vllm.adapterVolume.existingClaim" in str(err.value)


@pytest.mark.parametrize(("content", "needle"), [
    ("{not json", "cannot read the training Job template"),
    (json.dumps({"kind": "Pod", "spec": {}}), "not a batch/v1 Job manifest"),
    (json.dumps({"kind": "Job", "spec": {"template": {"spec": {"containers": []}}}}), "exactly one container"),
])
def test_an_unusable_job_template_is_refused_before_a_job_exists(tmp_path, content, needle):
    (tmp_path / "job.json").write_text(content)
    training = Training(TrainerSettings(artifact_root=tmp_path.as_uri(), job_template=str(tmp_path / "job.json"),
                                        job_image="trace-trainer:1"))
    job = spec({"profile": "vllm", "adapter_dir": "cap"}).model_copy(update={
        "executor": "EXECUTOR_KUBERNETES", "config": {"max_steps": 2}})
    with pytest.raises(FailedPrecondition, match=needle):
        training.validate(job)


def test_a_symlinked_root_keeps_its_configured_spelling(tmp_path):
    """The vLLM server mounts the configured path; the trainer hands that on, resolved only to check."""
    (tmp_path / "volume").mkdir()
    os.symlink(tmp_path / "volume", tmp_path / "shared")
    training = Training(TrainerSettings(artifact_root=tmp_path.as_uri(), vllm_adapter_root=str(tmp_path / "shared"),
                                        endpoints={"vllm": {"base_url": PROFILE_URL}}))
    config = training.validate(spec({"profile": "vllm", "adapter_dir": "cap/"}))
    assert config.vllm.adapter_dir == str(tmp_path / "shared" / "cap")


@pytest.mark.parametrize("make_root, writable", [
    (lambda root: root.mkdir(), True),
    (lambda root: None, False),                                       # not mounted in this pod
    (lambda root: (root.mkdir(), root.chmod(0o500)), os.geteuid() == 0),   # read-only (root may write anyway)
])
def test_local_executor_needs_the_adapter_root_writable_here(tmp_path, make_root, writable):
    """The local executor's workers write the versions from the trainer's own pod."""
    root = tmp_path / "adapters"
    make_root(root)
    training = Training(TrainerSettings(artifact_root=tmp_path.as_uri(), vllm_adapter_root=str(root),
                                        endpoints={"vllm": {"base_url": PROFILE_URL}}))
    job = spec({"profile": "vllm", "adapter_dir": "cap"})
    if writable:
        assert training.validate(job).vllm.adapter_dir == str(root / "cap")
    else:
        with pytest.raises(FailedPrecondition, match="not a writable directory in the trainer's pod"):
            training.validate(job)


def test_a_relative_adapter_root_is_refused_at_startup(tmp_path):
    with pytest.raises(ValidationError, match="must be an absolute path"):
        TrainerSettings(artifact_root=tmp_path.as_uri(), vllm_adapter_root="adapters")


def test_vllm_rollouts_without_an_adapter_root_are_refused(tmp_path):
    training = Training(TrainerSettings(artifact_root=tmp_path.as_uri(), endpoints={"vllm": {"base_url": PROFILE_URL}}))
    with pytest.raises(FailedPrecondition, match="TRACE_TRAINER_VLLM_ADAPTER_ROOT"):
        training.validate(spec({"profile": "vllm", "adapter_dir": "cap"}))


@pytest.mark.parametrize(("extra", "needle"), [
    ({"api_key_env": "VLLM_KEY"}, "trainer sends no key"),    # it would never be sent
    ({"models": ["qwen*"]}, "remove models"),                 # it would never be checked
])
def test_trainer_profile_fields_that_would_be_inert_are_refused(tmp_path, extra, needle):
    with pytest.raises(ValidationError, match=needle):
        TrainerSettings(artifact_root=tmp_path.as_uri(), endpoints={"vllm": {"base_url": PROFILE_URL, **extra}})
