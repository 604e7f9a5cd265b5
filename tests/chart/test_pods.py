"""Assertions over every rendered pod spec, in every value set: restricted pod security, GPU
requests exactly where meant (and on the right pool), probes, pinned images, no inlined secrets.

"Every pod spec" includes the bucket hook Job and the training-Job / sandbox-Pod templates the
chart embeds for the trainer and the environment service.
"""

from __future__ import annotations

import base64
import re

import pytest
import yaml

from tests.chart.helm import (
    CHART,
    FULLNAME,
    SERVICES,
    VALUE_SETS,
    VALUES_DIR,
    PodSpec,
    gpu_request,
    pod_specs,
    render,
)

SETS = sorted(VALUE_SETS)
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
#: Volume types the "restricted" Pod Security Standard allows.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}
#: Components whose pods talk to the Kubernetes API (and so mount a service-account token).
API_CLIENTS = {"trainer", "environment"}
#: The schema's rule (values.schema.json, envVar): a name part that says credential. A count or a size of
#: tokens (TRACE_ANALYSIS_LLM_MAX_TOKENS) is not one.
CREDENTIAL_NAME = re.compile(r"(^|_)(TOKEN|SECRET|PASSWORD|ACCESS_KEY|SECRET_KEY|API_KEY|CREDENTIALS?)(_|$)", re.I)


def restricted_violations(pod: PodSpec) -> list[str]:
    """Why a pod spec is not 'restricted' (empty when it is)."""
    v, spec = [], pod.spec
    psc = spec.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            v.append(f"{key} is set")
    if psc.get("runAsUser") == 0:
        v.append("pod runAsUser is 0")
    if psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        v.append("pod seccompProfile is not RuntimeDefault")
    for vol in spec.get("volumes", []):
        kinds = set(vol) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            v.append(f"volume {vol['name']} uses {sorted(kinds - RESTRICTED_VOLUMES)}")
    if pod.component not in API_CLIENTS and spec.get("automountServiceAccountToken") is not False:
        v.append("mounts a service-account token it does not need")
    for c in pod.containers():
        sc = c.get("securityContext", {})
        name = c["name"]
        if sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is not True:  # container overrides pod
            v.append(f"{name}: runAsNonRoot is not true")
        if sc.get("runAsUser") == 0:
            v.append(f"{name}: runAsUser is 0")
        if sc.get("allowPrivilegeEscalation") is not False:
            v.append(f"{name}: allowPrivilegeEscalation is not false")
        if sc.get("privileged"):
            v.append(f"{name}: privileged")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            v.append(f"{name}: capabilities do not drop ALL")
        if sc.get("capabilities", {}).get("add"):
            v.append(f"{name}: adds capabilities")
        if sc.get("seccompProfile", psc.get("seccompProfile", {})).get("type") != "RuntimeDefault":
            v.append(f"{name}: seccompProfile is not RuntimeDefault")
        if sc.get("readOnlyRootFilesystem") is not True:
            v.append(f"{name}: root filesystem is writable")
        for p in c.get("ports", []):
            if "hostPort" in p:
                v.append(f"{name}: hostPort {p['hostPort']}")
        mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
        if not mounts & {"/tmp", "/scratch"}:
            v.append(f"{name}: read-only root but no writable /tmp or /scratch")
    return v


@pytest.mark.parametrize("value_set", SETS)
def test_every_pod_is_restricted(value_set):
    pods = list(pod_specs(render(value_set)))
    assert pods, "no pod specs rendered"
    problems = [f"{p.where}: {msg}" for p in pods for msg in restricted_violations(p)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("mutate", "expected"), [
    (lambda s: s["containers"][0]["securityContext"].update(runAsNonRoot=False), "runAsNonRoot"),
    (lambda s: s["securityContext"].update(runAsUser=0), "runAsUser is 0"),
    (lambda s: s["containers"][0]["securityContext"].update(allowPrivilegeEscalation=True), "allowPrivilegeEscalation"),
    (lambda s: s["containers"][0]["securityContext"]["capabilities"].update(drop=[]), "drop ALL"),
    (lambda s: s["containers"][0]["securityContext"].update(readOnlyRootFilesystem=False), "writable"),
    (lambda s: s["securityContext"].pop("seccompProfile"), "seccompProfile"),
    (lambda s: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}), "hostPath"),
    (lambda s: s.update(automountServiceAccountToken=True), "service-account token"),
    (lambda s: s.update(hostNetwork=True), "hostNetwork"),
    (lambda s: s["containers"][0]["securityContext"]["capabilities"].update(add=["NET_RAW"]), "adds capabilities"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_restricted_check_catches_each_violation(mutate, expected):
    """The checker above must fail on each field it claims to check."""
    pod = next(p for p in pod_specs(render("defaults")) if p.component == "analysis")
    spec = yaml.safe_load(yaml.safe_dump(pod.spec))
    mutate(spec)
    problems = restricted_violations(PodSpec(pod.where, pod.component, spec))
    assert any(expected in p for p in problems), problems


# GPUs each pod requests, per value set (components not listed must request none).
GPU_EXPECTED = {
    "defaults": {"vllm": 1, "inference": 1, "training": 1},
    "external-minio": {"vllm": 1, "inference": 1, "training": 1},
    "monitoring": {"vllm": 1, "inference": 1, "training": 1},
    "tls": {"vllm": 1, "inference": 1, "training": 1},
    "gpu-off": {},
    "minimal": {},
    # tensorParallelSize 2 -> vLLM asks 2; rollout count 1; inference pool 2/pod; trainer pool 8/pod.
    "gpu-pools": {"vllm": 2, "rollout": 1, "inference": 2, "training": 8},
    # charts/trace/values-tau2-retail-vllm.yaml: vLLM over 2 GPUs, 2-GPU training Jobs (torchrun, 2 ranks)
    "tau2-retail-vllm": {"vllm": 2, "inference": 1, "training": 2},
    "tau2-retail-vllm-no-adapter-volume": {"vllm": 2, "inference": 1, "training": 2},
}
# The pool (values gpuPools.<pool>) each GPU component must be scheduled on.
GPU_POOL = {"vllm": "rollout", "rollout": "rollout", "inference": "inference", "training": "trainer"}


@pytest.mark.parametrize("value_set", SETS)
def test_gpu_requests_only_where_meant(value_set):
    expected = GPU_EXPECTED[value_set]
    got = {}
    for pod in pod_specs(render(value_set)):
        n = sum(gpu_request(c) for c in pod.containers())
        if n:
            got[pod.component] = n
    assert got == expected


@pytest.mark.parametrize("value_set", [s for s in SETS if s != "minimal"])   # minimal deploys no inference
def test_the_inference_service_computes_on_the_gpu_its_pod_gets(value_set):
    """TRACE_INFERENCE_DEVICE follows the pod's GPU request (inference.device empty): a GPU pod that
    loaded its compositions on the CPU would hold the GPU and leave it idle; gpu-off renders cpu."""
    r = render(value_set)
    container = r.get("Deployment", f"{FULLNAME}-inference")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TRACE_INFERENCE_DEVICE"] == ("cuda" if gpu_request(container) else "cpu")
    assert env["TRACE_INFERENCE_DTYPE"] == ("bfloat16" if value_set.startswith("tau2-retail-vllm") else "float32")


@pytest.mark.parametrize("value_set", ["defaults", "gpu-pools"])
def test_gpu_pods_land_on_their_pool_and_others_do_not(value_set):
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    if value_set == "gpu-pools":
        values["gpuPools"] = yaml.safe_load((VALUES_DIR / "gpu-pools.yaml").read_text())["gpuPools"]
    pools = values["gpuPools"]
    for pod in pod_specs(render(value_set)):
        selector = pod.spec.get("nodeSelector", {})
        tolerations = pod.spec.get("tolerations", [])
        pool_name = GPU_POOL.get(pod.component) if pod.component in GPU_EXPECTED[value_set] else None
        if pool_name:
            pool = pools[pool_name]
            assert pool["nodeSelector"].items() <= selector.items(), f"{pod.where}: not on pool {pool_name}"
            assert all(t in tolerations for t in pool["tolerations"]), f"{pod.where}: missing pool tolerations"
        else:
            for p in pools.values():
                assert not (p["nodeSelector"].items() & selector.items()) or not p["nodeSelector"], \
                    f"{pod.where}: selects a GPU pool without requesting a GPU"
                assert not any(t in tolerations for t in p["tolerations"]), f"{pod.where}: tolerates a GPU taint"


def test_gpu_pools_keep_the_workloads_own_node_selector():
    r = render("gpu-pools")
    spec = r.get("Deployment", f"{FULLNAME}-rollout")["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"kubernetes.io/arch": "amd64", "trace.example.com/pool": "vllm"}
    vllm = r.get("Deployment", f"{FULLNAME}-vllm")
    assert vllm["spec"]["strategy"]["type"] == "Recreate"  # no surge onto spare GPUs


@pytest.mark.parametrize("value_set", SETS)
def test_service_containers_have_grpc_probes(value_set):
    r = render(value_set)
    tls = value_set == "tls"
    seen = 0
    for name in SERVICES:
        name_ = f"{FULLNAME}-{name}"
        if not r.has("Deployment", name_):
            continue
        seen += 1
        (c,) = r.get("Deployment", name_)["spec"]["template"]["spec"]["containers"]
        grpc_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            probe = c.get(kind)
            assert probe, f"{value_set} {name}: no {kind}"
            if tls:  # kubelet gRPC probes cannot do TLS
                assert probe["tcpSocket"]["port"] == "grpc", f"{name} {kind}"
            else:
                assert probe["grpc"]["port"] == grpc_port, f"{name} {kind}: {probe}"
    assert seen >= 2


@pytest.mark.parametrize("value_set", ["defaults", "tau2-retail-vllm"])
def test_vllm_runs_as_a_uid_its_image_does_not_list(value_set):
    """The pod's UID 10001 has no /etc/passwd entry in the vLLM image: torch asks getpass.getuser() at
    import, which reads USER / LOGNAME first, else fails; its inductor cache must be writable (/tmp)."""
    r = render(value_set)
    pod = r.get("Deployment", f"{FULLNAME}-vllm")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["USER"] and env["LOGNAME"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    writable = {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")}
    for var in ("TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME", "VLLM_CACHE_ROOT", "HOME"):
        assert any(env[var] == root or env[var].startswith(root + "/") for root in writable), (var, env[var])


@pytest.mark.parametrize("value_set", ["defaults", "gpu-pools"])
def test_vllm_and_minio_have_http_probes(value_set):
    r = render(value_set)
    (c,) = r.get("Deployment", f"{FULLNAME}-vllm")["spec"]["template"]["spec"]["containers"]
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[kind]["httpGet"] == {"path": "/health", "port": "http"}
    (m,) = r.get("StatefulSet", f"{FULLNAME}-minio")["spec"]["template"]["spec"]["containers"]
    assert m["livenessProbe"]["httpGet"]["path"] == "/minio/health/live"
    assert m["readinessProbe"]["httpGet"]["path"] == "/minio/health/ready"


@pytest.mark.parametrize("value_set", SETS)
def test_images_are_pinned(value_set):
    for pod in pod_specs(render(value_set)):
        for c in pod.containers():
            image = c["image"]
            repo, _, tag = image.rpartition(":")
            assert repo and "/" not in tag, f"{pod.where}: {image} has no tag"
            assert tag != "latest", f"{pod.where}: {image}"
            if "/trace/" in f"/{repo}/" or repo.startswith("trace/"):
                assert tag == APP_VERSION, f"{pod.where}: TRACE image {image} should default to appVersion"


def test_image_registry_prefixes_trace_images_only():
    images = {c["image"] for p in pod_specs(render("gpu-pools")) for c in p.containers()}
    assert f"registry.example.com/ml/trace/trainer:{APP_VERSION}" in images
    assert f"registry.example.com/ml/trace/sandbox:{APP_VERSION}" in images
    assert any(i.startswith("vllm/vllm-openai:v") for i in images)


def _secret_literals(r) -> set[str]:
    out = set()
    for s in r.of_kind("Secret"):
        for v in (s.get("data") or {}).values():
            out.add(base64.b64decode(v).decode())
        out.update((s.get("stringData") or {}).values())
    return {v for v in out if len(v) >= 8}


@pytest.mark.parametrize("value_set", SETS)
def test_secrets_are_never_inlined(value_set):
    r = render(value_set)
    literals = _secret_literals(r)
    problems = []
    for pod in pod_specs(r):
        for c in pod.containers():
            for e in c.get("env", []):
                where = f"{pod.where} {c['name']} {e['name']}"
                if CREDENTIAL_NAME.search(e["name"]):
                    ref = e.get("valueFrom", {}).get("secretKeyRef", {})
                    if "value" in e or not (ref.get("name") and ref.get("key")):
                        problems.append(f"{where}: credential not taken from a Secret by name")
                if "value" in e and any(lit in e["value"] for lit in literals):
                    problems.append(f"{where}: contains a Secret's value")
            assert not c.get("envFrom"), f"{pod.where}: envFrom hides what is injected"
    assert not problems, "\n".join(problems)


def test_generated_secrets_exist_where_referenced():
    """Every secretKeyRef names a Secret the chart renders, or one the values say exists."""
    external = {"trace-auth", "trace-s3", "llm-api-key", "hf-token"}
    for value_set in SETS:
        r = render(value_set)
        rendered = {s["metadata"]["name"] for s in r.of_kind("Secret")}
        for pod in pod_specs(r):
            for c in pod.containers():
                for e in c.get("env", []):
                    ref = e.get("valueFrom", {}).get("secretKeyRef")
                    if ref:
                        assert ref["name"] in rendered | external, f"{value_set} {pod.where}: {ref}"
