"""The GPU-cluster example trains as the reference does: `charts/trace/values-tau2-retail-vllm.yaml`
renders (schema-validated by helm) a vLLM server with runtime LoRA updating that reads the claim
the training Jobs write adapter versions to, sized for `examples/tau2-retail-vllm.yaml`; and the
trainer, with the settings the chart renders for it, accepts that config's GRPO configs -- the
adapters' vLLM rollouts under the Kubernetes executor -- through its ValidateTrainingConfig,
as tracectl's Pipeline.check sends them, and refuses vLLM rollouts without the claim. Real pieces:
the helm render, the trainer's servicer and settings loaded from the rendered env, its Job builder."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from google.protobuf.json_format import MessageToDict

from services.trainer.kubernetes_job import build_job
from services.trainer.service import Training
from services.trainer.servicer import TrainerServicer
from services.trainer.specs import TrainingSpecModel
from tests.chart.helm import CHART, FULLNAME, KUBE_VERSION, NAMESPACE, helm, render
from tests.chart.test_training_jobs import trainer_settings, worker_spec
from trace_common.errors import FailedPrecondition, NotFound, PermissionDenied, TraceError
from tracectl.run.config import load_config
from tracectl.run.pipeline import Pipeline, T, config_struct

REPO = Path(__file__).resolve().parents[2]
RUN_CONFIG = load_config(REPO / "examples" / "tau2-retail-vllm.yaml")
VALUES = CHART / "values-tau2-retail-vllm.yaml"
SET = "tau2-retail-vllm"


def _vllm(value_set: str = SET) -> dict:
    """The vLLM pod spec of a render."""
    return render(value_set).get("Deployment", f"{FULLNAME}-vllm")["spec"]["template"]["spec"]


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_the_vllm_server_serves_the_configs_model_with_runtime_lora_updating():
    (c,) = _vllm()["containers"]
    args, env = c["args"], {e["name"]: e.get("value") for e in c["env"]}
    grpo = RUN_CONFIG.training.grpo
    assert [_flag(args, "--model")] == llm_models()          # the one model every LLM section names
    assert "--enable-lora" in args and env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert int(_flag(args, "--max-lora-rank")) >= grpo["lora_r"]               # vLLM refuses a higher rank
    assert int(_flag(args, "--max-loras")) >= RUN_CONFIG.training.parallel      # one served version per job
    assert _flag(args, "--logprobs-mode") == "processed_logprobs"               # guided tokens' behaviour logprobs
    assert "--enable-auto-tool-choice" in args and _flag(args, "--tool-call-parser") == "hermes"


def llm_models() -> list[str]:
    """The model every LLM section of the run config names (one server serves them all)."""
    c = RUN_CONFIG
    return sorted({c.base_agent.name, c.target.user_simulator.model, c.analysis.llm.model,
                   c.environments.llm.model, c.evaluation.gepa.model})


def test_the_server_and_the_training_jobs_share_the_adapter_claim():
    r = render(SET)
    spec = _vllm()
    (server,) = spec["containers"]
    job = json.loads(r.get("ConfigMap", f"{FULLNAME}-workload-templates")["data"]["training-job.json"])
    pod = job["spec"]["template"]["spec"]
    (train,) = pod["containers"]

    def claim(volumes: list[dict]) -> dict:
        return next(v for v in volumes if v["name"] == "adapters")["persistentVolumeClaim"]

    def mount(container: dict) -> dict:
        return next(m for m in container["volumeMounts"] if m["name"] == "adapters")

    assert claim(spec["volumes"]) == {"claimName": "trace-adapters", "readOnly": True}    # the server only reads
    assert claim(pod["volumes"]) == {"claimName": "trace-adapters"}                       # the Jobs write
    assert mount(server) == {"name": "adapters", "mountPath": "/adapters", "readOnly": True}
    assert mount(train) == {"name": "adapters", "mountPath": "/adapters"}
    (trainer,) = r.get("Deployment", f"{FULLNAME}-trainer")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert env["TRACE_TRAINER_VLLM_ADAPTER_ROOT"] == "/adapters"
    assert json.loads(env["TRACE_TRAINER_ENDPOINTS"]) == {"vllm": {"base_url": f"http://{FULLNAME}-vllm:8000/v1"}}


def test_the_trainer_and_its_jobs_know_tau2s_user_simulator():
    """GRPO on the tau2 target plays conversations with a simulated user: the trainer and every training
    Job get the in-chart vLLM as TRACE_TAU2_USER_* (found by `tracectl rehearse`: the jobs had none)."""
    r = render(SET)
    (trainer,) = r.get("Deployment", f"{FULLNAME}-trainer")["spec"]["template"]["spec"]["containers"]
    job = json.loads(r.get("ConfigMap", f"{FULLNAME}-workload-templates")["data"]["training-job.json"])
    (train,) = job["spec"]["template"]["spec"]["containers"]
    for container in (trainer, train):
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["TRACE_TAU2_USER_BASE_URL"] == "http://trace-vllm:8000/v1"
        assert env["TRACE_TAU2_USER_MODEL"] == RUN_CONFIG.target.user_simulator.model


def _claim(pod: dict, container: dict, volume: str) -> tuple[dict, dict]:
    """(the pod's persistentVolumeClaim source of `volume`, the container's mount of it)."""
    return (next(v for v in pod["volumes"] if v["name"] == volume)["persistentVolumeClaim"],
            next(m for m in container["volumeMounts"] if m["name"] == volume))


def _weights(pod: dict, container: dict) -> tuple[dict, dict]:
    return _claim(pod, container, "weights")


def test_every_pod_that_loads_the_base_mounts_the_weights_the_server_serves():
    """The served base agent's name is a directory of the weights claim (modelVolume): vLLM serves it
    under that path after its init container filled it, and every pod that loads the base (the trainer,
    its Jobs, rollout, environment, inference: their model roots list the mount) mounts it read-only."""
    r = render(SET)
    spec = _vllm()
    (server,) = spec["containers"]
    mount_path = "/weights"
    assert _flag(server["args"], "--model") == RUN_CONFIG.base_agent.name
    assert RUN_CONFIG.base_agent.name.startswith(mount_path + "/") and "--served-model-name" not in server["args"]

    read_only = ({"claimName": "trace-weights", "readOnly": True},
                 {"name": "weights", "mountPath": mount_path, "readOnly": True})
    assert _weights(spec, server)[1] == read_only[1]
    (fetch,) = spec["initContainers"]                  # the only writer, before the server starts
    assert fetch["command"][-3:] == ["Qwen/Qwen3-30B-A3B-Instruct-2507", "main", RUN_CONFIG.base_agent.name]
    # one volume for the claim (a pod naming one claim twice never starts), read-write for the filler only
    assert [v["name"] for v in spec["volumes"]].count("weights") == 1
    assert [v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"]
            if "persistentVolumeClaim" in v].count("trace-weights") == 1
    assert _weights(spec, fetch) == ({"claimName": "trace-weights"}, {"name": "weights", "mountPath": mount_path})
    job = json.loads(r.get("ConfigMap", f"{FULLNAME}-workload-templates")["data"]["training-job.json"])
    (train,) = job["spec"]["template"]["spec"]["containers"]
    assert _weights(job["spec"]["template"]["spec"], train) == read_only
    for service in ("trainer", "rollout", "environment", "inference"):
        pod = r.get("Deployment", f"{FULLNAME}-{service}")["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        assert _weights(pod, c) == read_only, service
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env[f"TRACE_{service.upper()}_MODEL_ROOTS"] == mount_path, service
    pod = r.get("Deployment", f"{FULLNAME}-analysis")["spec"]["template"]["spec"]   # loads no model
    assert all(v["name"] != "weights" for v in pod["volumes"])


def test_the_tau2_data_claim_is_mounted_read_only_where_the_target_is_read():
    """dataVolume: the claim of tau2-bench's domains is mounted read-only at /data/tau2 in the pods that
    read the target (rollout, environment, trainer and its Jobs), whose data roots hold the run config's
    target.uri; the analysis, inference and vLLM pods read no target and mount none."""
    r = render(SET)
    mount_path = "/data/tau2"
    assert str(RUN_CONFIG.target.uri).removeprefix("file://").startswith(mount_path + "/")
    want = ({"claimName": "trace-tau2-data", "readOnly": True}, {"name": "data", "mountPath": mount_path,
                                                                "readOnly": True})

    def data(pod: dict) -> tuple[dict, dict]:
        (c,) = pod["containers"]
        return _claim(pod, c, "data")

    job = json.loads(r.get("ConfigMap", f"{FULLNAME}-workload-templates")["data"]["training-job.json"])
    assert data(job["spec"]["template"]["spec"]) == want
    for service in ("rollout", "environment", "trainer"):
        pod = r.get("Deployment", f"{FULLNAME}-{service}")["spec"]["template"]["spec"]
        assert data(pod) == want, service
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert json.loads(env[f"TRACE_{service.upper()}_DATA_ROOTS"]) == [mount_path], service
    for name in ("analysis", "inference", "vllm"):
        pod = r.get("Deployment", f"{FULLNAME}-{name}")["spec"]["template"]["spec"]
        assert all(v["name"] != "data" for v in pod["volumes"]), name


def test_without_a_weights_claim_no_pod_mounts_one():
    """modelVolume unset (the default): no weights volume anywhere, no init container in vLLM."""
    r = render("defaults")
    pods = [d["spec"]["template"]["spec"] for d in r.of_kind("Deployment")]
    job = json.loads(r.get("ConfigMap", f"{FULLNAME}-workload-templates")["data"]["training-job.json"])
    pods.append(job["spec"]["template"]["spec"])
    assert len(pods) >= 6
    for pod in pods:   # nor a data volume (dataVolume unset, the default)
        assert all(v["name"] not in ("weights", "data") for v in pod.get("volumes", []))
        assert all(m["name"] not in ("weights", "data") for c in pod["containers"] for m in c.get("volumeMounts", []))
    assert "initContainers" not in _vllm("defaults")


#: A stand-in huggingface_hub for the init container's script: it lists STUB_FILES, writes the files
#: named in STUB_WRITE into local_dir, fails listing when STUB_OFFLINE is set, and logs every call.
_STUB_HUB = """
import os
def _log(what):
    with open(os.environ["STUB_LOG"], "a") as f:
        f.write(what + "\\n")
class HfApi:
    def list_repo_files(self, repo, revision=None):
        _log(f"list {repo}@{revision}")
        if os.environ.get("STUB_OFFLINE"):
            raise OSError("the Hub is unreachable")
        return os.environ["STUB_FILES"].split(",")
def snapshot_download(repo_id, revision, local_dir):
    _log(f"download {repo_id}@{revision}")
    for name in filter(None, os.environ["STUB_WRITE"].split(",")):
        path = os.path.join(local_dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "w").write("w")
    return local_dir
"""

FILES = "config.json,model-00001.safetensors,sub/tokenizer.json"

#: (case, marker already there, files the download writes, Hub reachable,
#:  exit ok, Hub calls made, marker after, message fragment)
FETCH_CASES = [
    ("fresh claim", None, FILES, True, True, ["list", "download"], "Q/M@main", "complete in"),
    ("same revision already complete: no Hub call", "Q/M@main", "", False, True, [], "Q/M@main", "already complete"),
    ("another revision recorded: fetched again", "Q/M@v0", FILES, True, True, ["list", "download"], "Q/M@main", ""),
    ("download left a file out: no marker", None, "config.json,sub/tokenizer.json", True, False,
     ["list", "download"], None, "incomplete: 1 files missing, e.g. model-00001.safetensors"),
    ("Hub unreachable, files from an interrupted fill: no marker", None, "", False, False, ["list"], None,
     "unreachable"),
]


@pytest.mark.parametrize(("case", "marker", "write", "online", "ok", "calls", "after", "message"), FETCH_CASES,
                         ids=[c[0] for c in FETCH_CASES])
def test_the_init_container_marks_the_weights_complete_only_when_every_file_is_there(
        case, marker, write, online, ok, calls, after, message, tmp_path):
    """The rendered fetch-weights script, run as the init container runs it (python3 -c SCRIPT repo revision
    dir) against a stand-in Hub: the marker is written only after every listed file is on the claim, and a
    restart of a complete fill calls no Hub."""
    (fetch,) = _vllm()["initContainers"]
    python, flag, script, repo, revision, _ = fetch["command"]
    assert (python, flag, repo, revision) == ("python3", "-c", "Qwen/Qwen3-30B-A3B-Instruct-2507", "main")
    (tmp_path / "stub" / "huggingface_hub").mkdir(parents=True)
    (tmp_path / "stub" / "huggingface_hub" / "__init__.py").write_text(_STUB_HUB)
    dest = tmp_path / "weights" / "M"
    dest.mkdir(parents=True)
    if marker:
        (dest / ".trace-download").write_text(marker)
    log = tmp_path / "calls.log"
    log.write_text("")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path / "stub"), "STUB_LOG": str(log),
           "STUB_FILES": FILES, "STUB_WRITE": write, **({} if online else {"STUB_OFFLINE": "1"})}
    proc = subprocess.run([sys.executable, "-c", script, "Q/M", "main", str(dest)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode == 0) == ok, proc.stderr
    assert [line.split()[0] for line in log.read_text().splitlines()] == calls
    marker_file = dest / ".trace-download"
    assert (marker_file.read_text() if marker_file.exists() else None) == after
    assert not (dest / ".trace-download.tmp").exists()
    assert message in proc.stdout + proc.stderr


@pytest.mark.parametrize(("model", "error", "fragments"), [
    # the config's served name on the claim (a directory holding the model, as the init container leaves it)
    ("CONFIG", None, []),
    # as rendered but on this machine, where the claim is not mounted: permitted, only the directory is missing
    ("MOUNTED", NotFound, ["spec.policy.model '/weights/Qwen3-30B-A3B-Instruct-2507' has no config.json"]),
    # what the example named before the weights claim: a Hugging Face id the trainer may not read
    ("Qwen/Qwen3-30B-A3B-Instruct-2507", PermissionDenied, ["spec.policy.model", "is the served model name",
                                                           "TRACE_TRAINER_MODEL_ROOTS"]),
])
def test_the_trainer_may_load_the_served_base_agents_weights(model, error, fragments, tmp_path, monkeypatch):
    """An adapter job of the example's shape (its base agent, its vLLM GRPO config) through the trainer's
    own validation, with the model roots the chart renders; for CONFIG, the mount is a local directory."""
    settings = trainer_settings(SET, tmp_path, monkeypatch)
    name = RUN_CONFIG.base_agent.name
    if model == "CONFIG":
        mount = tmp_path / "weights"
        (mount / Path(name).name).mkdir(parents=True)
        (mount / Path(name).name / "config.json").write_text("{}")
        monkeypatch.setenv("TRACE_TRAINER_MODEL_ROOTS", str(mount))
        settings, name = type(settings)(), str(mount / Path(name).name)
    elif model != "MOUNTED":
        name = model
    assert settings.model_roots == [(tmp_path / "weights").as_uri() if model == "CONFIG" else "file:///weights"]
    policy = MessageToDict(Pipeline(RUN_CONFIG, runner=None, store=None, manifest=None).base_policy(),  # type: ignore[arg-type]
                           preserving_proto_field_name=True)
    spec = TrainingSpecModel.model_validate(dict(
        kind="TRAINING_KIND_ADAPTER", capability="precondition_verification",
        environments=[{"name": "store", "params": {"task_types": "precondition_check"}}],
        # the store stands in for a capability environment; it has no per-instance guidance to show
        # the tests render release "demo": its vLLM Service stands for the config's trace-vllm
        policy={**policy, "model": name, "endpoint": f"http://{FULLNAME}-vllm:8000/v1"}, config={**CONFIGS[GRPO][2], "guidance_fraction": 0},
        executor="EXECUTOR_KUBERNETES"))
    training = Training(settings)
    if error is None:
        assert training.validate(spec).rollout_backend == "vllm"
        return
    with pytest.raises(error) as err:
        training.validate(spec)
    for fragment in fragments:
        assert fragment in str(err.value)


@pytest.mark.parametrize(("kind", "processes"), [("TRAINING_KIND_ADAPTER", 2), ("TRAINING_KIND_GATES", 1)])
def test_adapter_jobs_spread_over_their_gpus_and_gate_jobs_take_one(kind, processes, tmp_path, monkeypatch):
    """torchrun starts one process per GPU the Job asks for; gate training runs in one process."""
    settings = trainer_settings(SET, tmp_path, monkeypatch)
    job = build_job(worker_spec().model_copy(update={"kind": kind}), settings, namespace=NAMESPACE)
    kubernetes_validate.validate(job, KUBE_VERSION, strict=True)
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert f"--nproc-per-node={processes}" in c["command"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == c["resources"]["requests"]["nvidia.com/gpu"] == processes


def _validate(settings, field: str, kind: int, config: dict, executor: int) -> dict:
    """The trainer's ValidateTrainingConfig (servicer and domain), asked as Pipeline.check asks it."""
    request = T.ValidateTrainingConfigRequest(kind=kind, config=config_struct(field, config), field_path=field,
                                              executor=executor)
    servicer = TrainerServicer(Training(settings))
    return MessageToDict(asyncio.run(servicer.ValidateTrainingConfig(request, None)).config.values)


CONFIGS = {label: (field, kind, config) for label, field, kind, config in
           Pipeline(RUN_CONFIG, runner=None, store=None, manifest=None).trainer_configs()}  # type: ignore[arg-type]
GRPO, TARGET, GATES = CONFIGS


@pytest.mark.parametrize(("value_set", "label", "executor", "vllm", "refused"), [
    # the adapters and the grpo_target arm: vLLM rollouts through the in-chart server, versions on the claim
    (SET, GRPO, T.EXECUTOR_KUBERNETES, {"base_url": f"http://{FULLNAME}-vllm:8000/v1", "profile": "vllm",
                                        "adapter_dir": "/adapters/tau2-retail-qwen3"}, None),
    (SET, TARGET, T.EXECUTOR_KUBERNETES, {"base_url": f"http://{FULLNAME}-vllm:8000/v1", "profile": "vllm",
                                          "adapter_dir": "/adapters/tau2-retail-qwen3"}, None),
    # gates roll out in-process (the gate config has no vLLM backend)
    (SET, GATES, T.EXECUTOR_KUBERNETES, None, None),
    # the fields only (a stand-in trainer): nothing resolved against the settings
    (SET, GRPO, T.EXECUTOR_UNSPECIFIED, {"profile": "vllm", "adapter_dir": "tau2-retail-qwen3"}, None),
    # the trainer pod itself does not mount the claim: its local workers could not write the versions
    (SET, GRPO, T.EXECUTOR_LOCAL, None, "not a writable directory in the trainer's pod"),
    # no claim shared by the server and the Jobs: refused, naming the value that provides it
    ("tau2-retail-vllm-no-adapter-volume", GRPO, T.EXECUTOR_KUBERNETES, None, "vllm.adapterVolume.existingClaim"),
])
def test_the_trainer_accepts_the_configs_training_with_the_charts_settings(value_set, label, executor, vllm, refused,
                                                                          tmp_path, monkeypatch):
    settings = trainer_settings(value_set, tmp_path, monkeypatch)
    field, kind, config = CONFIGS[label]
    if refused:
        with pytest.raises(FailedPrecondition) as err:
            _validate(settings, field, kind, config, executor)
        assert refused in str(err.value) and "TRACE_TRAINER_VLLM_ADAPTER_ROOT" in str(err.value)
        return
    parsed = _validate(settings, field, kind, config, executor)
    assert parsed["rollout_backend"] == ("vllm" if vllm else "in_process")
    if vllm:
        assert {k: parsed["vllm"].get(k, "") for k in vllm} == vllm
        assert parsed["lora_r"] == config["lora_r"]


def test_an_unknown_executor_is_refused(tmp_path, monkeypatch):
    settings = trainer_settings(SET, tmp_path, monkeypatch)
    field, kind, config = CONFIGS[GRPO]
    with pytest.raises(TraceError, match="executor: expected EXECUTOR_LOCAL or EXECUTOR_KUBERNETES, got '7'"):
        _validate(settings, field, kind, config, 7)


def test_the_configs_addresses_are_the_services_the_chart_renders_for_release_trace():
    """The run config names the Services of release "trace" (its comment): each host:port is one."""
    proc = helm("template", "trace", str(CHART), "--namespace", "trace", "--kube-version", KUBE_VERSION,
                "-f", str(VALUES))
    assert proc.returncode == 0, proc.stderr
    ports = {(d["metadata"]["name"], p["port"]) for d in yaml.safe_load_all(proc.stdout)
             if d and d["kind"] == "Service" for p in d["spec"]["ports"]}
    c = RUN_CONFIG
    urls = [c.base_agent.endpoint, c.target.user_simulator.base_url, c.analysis.llm.base_url,
            c.environments.llm.base_url, c.evaluation.gepa.base_url]
    addresses = [*c.services.values(), c.store.s3_endpoint,
                 *(u.removeprefix("http://").split("/")[0] for u in urls)]
    for address in addresses:
        host, port = address.rsplit(":", 1)
        assert (host, int(port)) in ports, address
