"""Sandbox workers as Kubernetes pods (sandbox/pods.py): the manifests the service creates, and
the whole path -- create, wait, attach, JSON Lines, end, delete -- against an emulated API server.

No kube-apiserver or kubelet exists here. kmock's emulator plays the API server (objects in
memory, no schema validation: the manifests are validated separately with kubernetes-validate,
from the chart's own rendered template). `Kubelet` below plays the node's part for the pods the
service creates: it starts the pod's container command -- the real sandbox worker, as the pod's
non-root uid, with the pod's environment and an emptyDir-like scratch dir --, reports the
container state in the pod's status, serves pods/attach (the websocket channel protocol the
`kubernetes` client speaks), and on a pod's deletion or a simulated OOM kill ends the container.
What it cannot show: that a real CNI enforces the NetworkPolicy, that a real runtime applies
the security context, image pulls, scheduling.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import shutil
import signal
import sys
import tempfile
from typing import Any

import aiohttp
import aiohttp.web
import kmock
import kubernetes_validate
import pytest
from kubernetes import client

from services.environment.sandbox.config import PodConfig, SandboxConfig
from services.environment.sandbox.parent import PROJECT_ROOT, SandboxViolation, SandboxWorker
from services.environment.sandbox.pods import (
    LABEL_WORKER,
    WORKER_COMMAND,
    build_pod,
    default_template,
    egress_policy,
    facts_hold,
    pod_facts,
)
from services.environment.settings import EnvironmentSettings
from tests.chart.helm import FULLNAME, KUBE_VERSION, render
from trace_common.errors import FailedPrecondition, Unavailable

from .test_hostile_envs import module

NS = "trace"
ROOT = os.geteuid() == 0 and sys.platform.startswith("linux")


def _usable_by_others(path: str) -> bool:
    real = os.path.realpath(path)
    parts = real.split("/")
    dirs = ["/".join(parts[:i]) or "/" for i in range(1, len(parts))]
    return all(os.stat(d).st_mode & 0o001 for d in dirs) and bool(os.stat(real).st_mode & 0o005)


#: Whether the fake kubelet can run the container as the pod's non-root uid, as a real one does. Not
#: where the interpreter lives under a directory only root may enter (here: /root/.pyenv): then the
#: container runs as root, and the worker adds the layers a root process can have (which a
#: restricted pod would not) -- the pod-level facts the service checks are the same either way.
AS_POD_UID = ROOT and _usable_by_others(sys.executable)


def chart_template(value_set: str = "defaults") -> dict[str, Any]:
    return next(m for m in render(value_set).embedded() if m["kind"] == "Pod")


def chart_policy() -> dict[str, Any]:
    return render("defaults").get("NetworkPolicy", f"{FULLNAME}-sandbox")


# -- manifests ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("template", "config"), [
    ("chart:defaults", SandboxConfig(backend="kubernetes")),
    ("chart:gpu-pools", SandboxConfig(backend="kubernetes", memory_mb=2048, pod=PodConfig(cpu="500m", deadline_s=600))),
    ("builtin", SandboxConfig(backend="kubernetes", pod=PodConfig(image="registry.example/trace/sandbox:1.0.0"))),
], ids=["chart-defaults", "chart-gpu-pools", "builtin"])
def test_the_pod_the_service_creates_is_valid_and_locked_down(template, config):
    base = chart_template(template.split(":")[1]) if template.startswith("chart") else default_template()
    pod = build_pod(config, "precondition_verification-v3", namespace=NS, worker_id="abc123", template=base)
    kubernetes_validate.validate(pod, KUBE_VERSION, strict=True)
    spec = pod["spec"]
    (c,) = spec["containers"]
    assert c["command"] == WORKER_COMMAND and c["stdin"] is True and c["tty"] is False
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert spec["restartPolicy"] == "Never" and spec["activeDeadlineSeconds"] == config.pod.deadline_s
    assert c["resources"]["limits"]["memory"] == f"{config.memory_mb}Mi"
    assert c["resources"]["limits"]["cpu"] == config.pod.cpu
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] and sc["runAsNonRoot"] and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert all(set(v) == {"name", "emptyDir"} for v in spec["volumes"])
    env = {e["name"]: e for e in c["env"]}
    assert all("valueFrom" not in e for e in env.values()) and "envFrom" not in c
    assert not any(k.startswith("TRACE_") and k != "TRACE_SANDBOX_CONFIG" for k in env)
    worker = json.loads(env["TRACE_SANDBOX_CONFIG"]["value"])
    assert worker["scratch"] == "/scratch" and worker["limits"]["memory_bytes"] == config.memory_mb << 20
    assert pod["metadata"]["labels"][LABEL_WORKER] == "abc123" and len(pod["metadata"]["name"]) <= 63
    # the chart's NetworkPolicy selects it (egress denied) -- also for the chart's own labels
    if template.startswith("chart"):
        assert egress_policy([chart_policy()], pod["metadata"]["labels"]) == f"{FULLNAME}-sandbox"
    assert facts_hold(pod_facts(pod, [chart_policy()] if template.startswith("chart") else []),
                      require_egress_policy=template.startswith("chart")) == []


#: The hostile table's file reads (test_hostile_envs.py, issue #28) as a pod sees them: no host
#: path, store or other worker's directory is mounted, so the pod's filesystem is its image (read-only)
#: plus its own emptyDir scratch. What a real cluster's runtime does with that is not checked here.
POD_READS = ["/tmp", "/etc/passwd", "/var/lib/trace/artifacts", "/scratch-of-another-worker"]


@pytest.mark.parametrize("template", ["chart:defaults", "chart:gpu-pools", "builtin"])
def test_the_pod_mounts_nothing_of_the_read_table(template):
    base = chart_template(template.split(":")[1]) if template.startswith("chart") else default_template()
    pod = build_pod(SandboxConfig(backend="kubernetes", pod=PodConfig(image="registry.example/trace/sandbox:1")),
                    "env", namespace=NS, worker_id="w", template=base)
    spec = pod["spec"]
    (c,) = spec["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert [v["name"] for v in spec["volumes"]] == ["scratch"] and set(spec["volumes"][0]) == {"name", "emptyDir"}
    assert c["volumeMounts"] == [{"name": "scratch", "mountPath": "/scratch"}]
    assert not any("hostPath" in v or "persistentVolumeClaim" in v or "csi" in v for v in spec["volumes"])
    mounted = [m["mountPath"] for m in c["volumeMounts"]]
    for path in POD_READS:
        assert not any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounted), (path, mounted)
    assert json.loads({e["name"]: e["value"] for e in c["env"]}["TRACE_SANDBOX_CONFIG"])["fs_root"] is True


def _with(path: str, value: Any):
    def change(t: dict) -> dict:
        t = copy.deepcopy(t)
        node = t
        *parents, last = path.split(".")
        for p in parents:
            node = node[int(p)] if p.isdigit() else node.setdefault(p, {})
        node[last] = value
        return t
    return change


BAD_TEMPLATES = [
    ("secret_volume", _with("spec.volumes", [{"name": "s", "secret": {"secretName": "trace-s3"}}]), "kind secret"),
    ("config_map_volume", _with("spec.volumes", [{"name": "c", "configMap": {"name": "x"}}]), "kind configMap"),
    ("host_path", _with("spec.volumes", [{"name": "h", "hostPath": {"path": "/"}}]), "kind hostPath"),
    ("token_projection", _with("spec.volumes", [{"name": "t", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token"}}]}}]), "kind projected"),
    ("env_from_secret", _with("spec.containers.0.env", [{"name": "K", "valueFrom": {"secretKeyRef": {
        "name": "trace-s3", "key": "secret-key"}}}]), "valueFrom"),
    ("env_from", _with("spec.containers.0.envFrom", [{"secretRef": {"name": "trace-s3"}}]), "envFrom"),
    ("capabilities_added", _with("spec.containers.0.securityContext", {"capabilities": {"add": ["SYS_ADMIN"]}}),
     "adds capabilities"),
    ("init_container", _with("spec.initContainers", [{"name": "i", "image": "busybox"}]), "initContainers"),
    ("sidecar", lambda t: _with("spec.containers", t["spec"]["containers"] * 2)(t), "2 containers"),
]


@pytest.mark.parametrize(("name", "change", "fragment"), BAD_TEMPLATES, ids=[b[0] for b in BAD_TEMPLATES])
def test_templates_that_would_give_the_pod_secrets_or_host_access_are_refused(name, change, fragment):
    with pytest.raises(FailedPrecondition, match=fragment):
        build_pod(SandboxConfig(backend="kubernetes"), "env", namespace=NS, worker_id="w",
                  template=change(chart_template()))


@pytest.mark.parametrize(("path", "value"), [
    ("spec.automountServiceAccountToken", True), ("spec.hostPID", True), ("spec.hostNetwork", True),
    ("spec.shareProcessNamespace", True), ("spec.securityContext", {"runAsNonRoot": False}),
    ("spec.containers.0.securityContext", {"privileged": True, "readOnlyRootFilesystem": False}),
    ("spec.containers.0.command", ["sh", "-c", "cat /var/run/secrets/*"]),
])
def test_what_containment_needs_is_forced_whatever_the_template_says(path, value):
    pod = build_pod(SandboxConfig(backend="kubernetes"), "env", namespace=NS, worker_id="w",
                    template=_with(path, value)(chart_template()))
    assert facts_hold(pod_facts(pod, [chart_policy()]), require_egress_policy=True) == []
    assert pod["spec"]["containers"][0]["command"] == WORKER_COMMAND


@pytest.mark.parametrize(("change", "selected"), [
    (lambda p: p, True),
    (lambda p: _with("spec.egress", [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}])(p), False),
    (lambda p: _with("spec.policyTypes", ["Ingress"])(p), False),
    (lambda p: _with("spec.podSelector", {"matchLabels": {"app.kubernetes.io/component": "environment"}})(p), False),
    (lambda p: _with("spec.podSelector", {"matchExpressions": [{"key": LABEL_WORKER, "operator": "Exists"}]})(p),
     True),
    (lambda p: _with("spec.podSelector", {})(p), True),  # selects every pod of the namespace
], ids=["chart", "egress-allowed", "ingress-only", "other-pods", "expression", "all-pods"])
def test_egress_policy_must_select_the_pod_and_allow_nothing(change, selected):
    pod = build_pod(SandboxConfig(backend="kubernetes"), "env", namespace=NS, worker_id="w", template=chart_template())
    found = egress_policy([change(chart_policy())], pod["metadata"]["labels"])
    assert (found is not None) is selected


def test_chart_env_configures_the_pod_backend(monkeypatch):
    (c,) = render("defaults").get("Deployment", f"{FULLNAME}-environment")["spec"]["template"]["spec"]["containers"]
    for e in c["env"]:
        if e["name"].startswith("TRACE_ENVIRONMENT_SANDBOX_"):
            monkeypatch.setenv(e["name"], NS if "valueFrom" in e else e["value"])
    sandbox = EnvironmentSettings().sandbox_config()
    values = render("defaults").get("ConfigMap", f"{FULLNAME}-workload-templates")
    assert sandbox.backend == "kubernetes" and sandbox.pod.namespace == NS
    assert sandbox.pod.template == "/etc/trace/templates/sandbox-pod.json" and "sandbox-pod.json" in values["data"]
    (tc,) = chart_template()["spec"]["containers"]
    assert f"{sandbox.memory_mb}Mi" == "1024Mi" and tc["resources"]["limits"]["memory"] == "1Gi"
    assert sandbox.pod.cpu == str(tc["resources"]["limits"]["cpu"]) and sandbox.pod.deadline_s == 3600


def test_kubernetes_backend_without_an_image_is_refused_at_startup():
    with pytest.raises(ValueError, match="TRACE_ENVIRONMENT_SANDBOX_POD_IMAGE"):
        EnvironmentSettings(sandbox_backend="kubernetes")


# -- the emulated cluster ----------------------------------------------------------------------------

class Kubelet(kmock.KubernetesEmulator):
    """kmock's API server plus the kubelet's part for the pods it stores (module docstring).

    `pull_error`: report ErrImagePull instead of starting containers. `oom(name)`: end a
    container as the kernel's OOM killer in its cgroup would (SIGKILL, status OOMKilled)."""

    pull_error = False

    def _state(self) -> dict[str, Any]:
        if "_kubelet" not in self.__dict__:
            self.__dict__["_kubelet"] = {"procs": {}, "dirs": {}, "reasons": {}, "tasks": set()}
        return self.__dict__["_kubelet"]

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if raw.path.endswith("/attach") and raw.headers.get("Upgrade", "").lower() == "websocket":
            return await self._attach(raw.path.split("/")[-2], raw)
        return await super().__call__(raw)

    async def _handle(self, request):
        response = await super()._handle(request)
        res = request.resource
        if res is not None and getattr(res, "plural", None) == "pods" and not request.subresource:
            if request.action == kmock.action.CREATE:
                task = asyncio.get_running_loop().create_task(self._run(request.data))
                self._state()["tasks"].add(task)
            elif request.action == kmock.action.DELETE and request.name:
                self._kill(request.name)
        return response

    async def _status(self, name: str, status: dict[str, Any]) -> None:
        async with self.patch(f"/api/v1/namespaces/{NS}/pods/{name}/status", json={"status": status}) as resp:
            assert resp.status < 400, await resp.text()

    def _container_status(self, pod: dict, state: dict) -> dict[str, Any]:
        (c,) = pod["spec"]["containers"]
        return {"name": c["name"], "image": c["image"], "imageID": "", "ready": "running" in state,
                "restartCount": 0, "state": state}

    async def _run(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if self.pull_error:
            await self._status(name, {"phase": "Pending", "containerStatuses": [self._container_status(pod, {
                "waiting": {"reason": "ErrImagePull", "message": f"pull {pod['spec']['containers'][0]['image']}: "
                            "not found"}})]})
            return
        (c,) = pod["spec"]["containers"]
        scratch = tempfile.mkdtemp(prefix="trace-kubelet-", dir="/tmp")
        os.chmod(scratch, 0o777)  # the emptyDir the pod's uid writes
        self._state()["dirs"][name] = scratch
        env = {e["name"]: e["value"].replace("/scratch", scratch) for e in c["env"]}
        env |= {"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": str(PROJECT_ROOT)}  # the image's install
        psc = pod["spec"].get("securityContext") or {}
        user = {"user": psc["runAsUser"], "group": psc.get("runAsGroup", psc["runAsUser"])} if AS_POD_UID else {}
        assert c["command"][0] == "python"
        proc = await asyncio.create_subprocess_exec(
            sys.executable, *c["command"][1:], stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env, cwd=scratch, start_new_session=True, **user)
        self._state()["procs"][name] = proc
        await self._status(name, {"phase": "Running", "containerStatuses": [self._container_status(
            pod, {"running": {"startedAt": "2026-01-01T00:00:00Z"}})]})
        code = await proc.wait()
        exit_code = 128 - code if code < 0 else code
        reason = self._state()["reasons"].get(name) or ("Completed" if code == 0 else "Error")
        try:
            await self._status(name, {"phase": "Succeeded" if code == 0 else "Failed", "containerStatuses": [
                self._container_status(pod, {"terminated": {"exitCode": exit_code, "reason": reason}})]})
        except AssertionError:
            pass  # the pod was deleted: nothing to report on
        shutil.rmtree(scratch, ignore_errors=True)

    def _kill(self, name: str) -> None:
        proc = self._state()["procs"].get(name)
        if proc is not None and proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the whole container: supervisor and worker

    def oom(self, name: str) -> None:
        self._state()["reasons"][name] = "OOMKilled"
        self._kill(name)

    async def _attach(self, name: str, raw: aiohttp.web.BaseRequest) -> aiohttp.web.WebSocketResponse:
        ws = aiohttp.web.WebSocketResponse(protocols=("v4.channel.k8s.io",))
        await ws.prepare(raw)
        proc = self._state()["procs"].get(name)
        if proc is None:
            await ws.send_bytes(b"\x03" + json.dumps({"status": "Failure", "message": "no container"}).encode())
            await ws.close()
            return ws

        async def pump(stream, channel: int) -> None:
            while chunk := await stream.read(1 << 16):
                await ws.send_bytes(bytes([channel]) + chunk)

        async def feed() -> None:
            async for msg in ws:
                data = msg.data.encode() if msg.type == aiohttp.WSMsgType.TEXT else msg.data
                if msg.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT) and data[:1] == b"\x00":
                    proc.stdin.write(data[1:])
                    await proc.stdin.drain()

        feeder = asyncio.get_running_loop().create_task(feed())
        await asyncio.gather(pump(proc.stdout, 1), pump(proc.stderr, 2))
        await proc.wait()
        await ws.send_bytes(b"\x03" + json.dumps({"status": "Success"}).encode())
        await ws.close()
        feeder.cancel()
        return ws


def api(k8s: kmock.RawHandler):
    host = str(k8s.url).rstrip("/")
    return lambda: client.ApiClient(client.Configuration(host=host))


def pod_config(k8s, **overrides) -> SandboxConfig:
    template = os.path.join(tempfile.mkdtemp(prefix="trace-pod-template-"), "sandbox-pod.json")
    with open(template, "w") as fh:
        json.dump(chart_template(), fh)
    return SandboxConfig(backend="kubernetes", call_timeout_s=20.0, startup_timeout_s=30.0, kubernetes_api=api(k8s),
                         pod=PodConfig(namespace=NS, template=template, poll_s=0.05), **overrides)


async def add_policy(k8s) -> None:
    await asyncio.to_thread(client.NetworkingV1Api(api(k8s)()).create_namespaced_network_policy, NS,
                            {**chart_policy(), "metadata": {**chart_policy()["metadata"], "namespace": NS}})


async def pods(k8s) -> list[str]:
    listed = await asyncio.to_thread(client.CoreV1Api(api(k8s)()).list_namespaced_pod, NS)
    return [p.metadata.name for p in listed.items]


KMOCK = pytest.mark.kmock(cls=Kubelet)


@KMOCK
@pytest.mark.asyncio
async def test_a_pod_worker_speaks_the_protocol_and_its_pod_is_deleted(kmock):
    await add_policy(kmock)
    worker = SandboxWorker(pod_config(kmock), label="toy-v1")
    hello = await asyncio.to_thread(worker.start)
    try:
        iso = worker.isolation
        assert iso["backend"] == "kubernetes" and iso["pod"] and "pod" in iso["held"] and iso["missing"] == []
        assert iso["pod_facts"]["egress_denied"] == f"{FULLNAME}-sandbox" and iso["pod_facts"]["no_secrets"]
        assert iso["seccomp"] and iso["rlimits"]
        if AS_POD_UID:  # non-root in its pod, as in a cluster: no uid drop, no namespaces of its own
            assert not iso["uid_dropped"] and not iso["pidns"]
            assert hello["isolation"]["uid"] == chart_template()["spec"]["securityContext"]["runAsUser"]
        assert await pods(kmock) == [iso["pod_name"]]
        info = await asyncio.to_thread(worker.call, "load", source=module("", 0))
        assert info["class"] == "Toy"
        obs = await asyncio.to_thread(worker.call, "reset", instance="a", seed=5)
        answer = str(__import__("random").Random(5).randrange(1000))
        assert obs["messages"][1]["content"] == f"say {answer}"
        assert (await asyncio.to_thread(worker.call, "step", instance="a", action={"message": answer}))["done"]
        assert (await asyncio.to_thread(worker.call, "result", instance="a"))["reward"] == 1.0
    finally:
        await asyncio.to_thread(worker.close)
    assert await pods(kmock) == []


@KMOCK
@pytest.mark.asyncio
async def test_without_an_egress_policy_the_pod_is_refused_unless_weak_is_allowed(kmock):
    with pytest.raises(FailedPrecondition, match=r"layer\(s\) pod not in force.*egress_denied"):
        await asyncio.to_thread(SandboxWorker(pod_config(kmock), label="nopolicy").start)
    assert await pods(kmock) == []
    weak = SandboxWorker(pod_config(kmock, allow_weak=True), label="weak")
    await asyncio.to_thread(weak.start)
    try:
        assert weak.isolation["missing"] == ["pod"] and weak.isolation["allowed_weak"]
        assert (await asyncio.to_thread(weak.call, "load", source=module("", 0)))["class"] == "Toy"
    finally:
        await asyncio.to_thread(weak.close)


@KMOCK
@pytest.mark.asyncio
async def test_a_pod_that_cannot_start_is_unavailable_with_its_reason(kmock):
    kmock.pull_error = True
    with pytest.raises(Unavailable, match="ErrImagePull"):
        await asyncio.to_thread(SandboxWorker(pod_config(kmock), label="nopull").start)
    assert await pods(kmock) == []


@KMOCK
@pytest.mark.asyncio
@pytest.mark.parametrize(("end", "body", "kind", "fragment"), [
    ("oom", "", "memory", "OOMKilled"),
    ("delete", "", "killed", "deleted from outside the service"),
    ("seccomp", "os = random._os\nos.kill(os.getpid() + 1, 9)\n", "syscall", "SIGSYS"),  # at load
])
async def test_how_a_pod_worker_ended_is_named(kmock, end, body, kind, fragment):
    await add_policy(kmock)
    worker = SandboxWorker(pod_config(kmock, audit_hook=False), label=f"end-{end}")
    await asyncio.to_thread(worker.start)
    name = worker.isolation["pod_name"]
    source = module("" if body else "import time\n", 0).replace(
        "def solve(seed):\n", "def solve(seed):\n    time.sleep(10)\n")
    try:
        if body:
            call = asyncio.to_thread(worker.call, "load", source=module(body, 0))
        else:
            await asyncio.to_thread(worker.call, "load", source=source)
            call = asyncio.to_thread(worker.call, "solve", seed=1)
        task = asyncio.get_running_loop().create_task(call)
        await asyncio.sleep(1.0)
        if end == "oom":
            kmock.oom(name)
        elif end == "delete":
            await asyncio.to_thread(client.CoreV1Api(api(kmock)()).delete_namespaced_pod, name, NS)
        with pytest.raises(SandboxViolation) as caught:
            await task
        assert caught.value.kind == kind and fragment in caught.value.detail, str(caught.value)
    finally:
        await asyncio.to_thread(worker.close)
    assert await pods(kmock) == []


def test_no_kubernetes_api_configured_is_unavailable(monkeypatch, tmp_path):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    config = SandboxConfig(backend="kubernetes", pod=PodConfig(namespace=NS, image="registry.example/sandbox:1"))
    with pytest.raises(Unavailable, match="no Kubernetes API is configured"):
        SandboxWorker(config, label="nocluster").start()
