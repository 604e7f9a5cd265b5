"""Sandbox workers as Kubernetes pods: one locked-down Pod per worker, the JSON Lines protocol
over the pod's attached stdin/stdout (backend "kubernetes" of `SandboxConfig`).

Inside a restricted pod the worker's own kernel layers that need root (PID, mount and network
namespaces, the uid drop) are unavailable, so in a cluster generated code gets a pod of its
own instead: its own PID, mount and network namespaces, its own filesystem, and nothing of the
service's (no service-account token, no secrets, no credentials in its environment). What the
service does per worker (`PodTransport`):

1. Build the Pod from the chart's template (`TRACE_ENVIRONMENT_SANDBOX_POD_TEMPLATE`, else a
   built-in one: `build_pod`) and *force* what containment needs, whatever the template says:
   automountServiceAccountToken false, enableServiceLinks false, no host namespaces, no shared
   process namespace, runAsNonRoot, seccompProfile RuntimeDefault, a read-only root
   filesystem, allowPrivilegeEscalation false, all capabilities dropped, restartPolicy Never,
   activeDeadlineSeconds, CPU / memory limits from the sandbox settings, one emptyDir scratch
   volume, stdin open, the worker command. A template that mounts anything but emptyDir
   volumes (secrets, config maps, projected tokens, host paths), takes env values from
   secrets or config maps (`valueFrom`, `envFrom`) or adds capabilities is refused.
2. Create it, wait until its container runs (image pull errors, unschedulable pods and
   startup past `startup_timeout_s` fail with UNAVAILABLE and the pod's own reason), attach
   to its stdin/stdout/stderr (pods/attach, websocket channel protocol) and speak the same
   protocol as a local worker.
3. Record the pod's containment facts from the object the API server returned (so admission
   changes count): `pod_facts`. They include `egress_denied`: the name of a NetworkPolicy in
   the namespace that selects the pod and allows no egress (the chart renders one); the
   `pod` layer holds when every fact does (`REQUIRED_POD_LAYERS` adds the worker's own
   rlimits and seccomp, which do apply in a container).
4. On close, delete the pod (grace period 0). When the attach stream ends, how the container
   ended (OOMKilled, exit code / signal, the pod's DeadlineExceeded, a deleted pod) goes to
   `endings.classify_ending`; the worker's supervisor line (CPU seconds, peak RSS) comes over
   the stderr channel as it does for a local worker.

What this module cannot check from inside the service: that the cluster's CNI enforces
NetworkPolicies (egress denial is only as real as the CNI), and that the node's runtime
honours the security context. `runtimeClassName` (e.g. gVisor) is the chart's choice.
"""

from __future__ import annotations

import copy
import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

from trace_common.errors import FailedPrecondition, Unavailable

from .config import SandboxConfig
from .endings import exit_report

REQUIRED_POD_LAYERS = ("pod", "rlimits", "seccomp")
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
CONTAINER = "worker"
SCRATCH = "/scratch"
WORKER_COMMAND = ["python", "-m", "services.environment.sandbox.worker"]
LABEL_WORKER = "trace.dev/sandbox-worker"
LABEL_ENV = "trace.dev/sandbox-env"
#: Labels of the built-in template (the chart's template carries the release's own).
DEFAULT_LABELS = {"app.kubernetes.io/name": "trace", "app.kubernetes.io/component": "sandbox",
                  "app.kubernetes.io/managed-by": "trace-environment"}
_FAILED_WAITING = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                   "CreateContainerError", "CrashLoopBackOff", "RunContainerError")


def default_template() -> dict[str, Any]:
    """The pod the service creates when no template file is configured (mirrors the chart's)."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "trace-sandbox-", "labels": dict(DEFAULT_LABELS)},
        "spec": {
            "restartPolicy": "Never", "automountServiceAccountToken": False, "enableServiceLinks": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": CONTAINER, "image": "", "command": list(WORKER_COMMAND), "stdin": True,
                            "resources": {}, "volumeMounts": [{"name": "scratch", "mountPath": SCRATCH}]}],
            "volumes": [{"name": "scratch", "emptyDir": {}}],
        },
    }


def load_template(path: str) -> dict[str, Any]:
    if not path:
        return default_template()
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise FailedPrecondition(f"cannot read the sandbox pod template {path}: {exc}; point "
                                 "TRACE_ENVIRONMENT_SANDBOX_POD_TEMPLATE at the chart's sandbox-pod.json") from exc
    if not isinstance(data, dict) or data.get("kind") != "Pod":
        raise FailedPrecondition(f"the sandbox pod template {path} is not a v1 Pod manifest")
    return data


def _slug(text: str, n: int = 40) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:n].strip("-") or "env"


def _refuse(what: str) -> FailedPrecondition:
    return FailedPrecondition(f"the sandbox pod template {what}; sandbox pods may mount only emptyDir volumes and "
                              "carry no secrets, config maps, tokens or host access: fix the template "
                              "(charts/trace, environment.sandbox)")


def build_pod(config: SandboxConfig, label: str, *, namespace: str, worker_id: str,
              template: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Pod manifest (a dict, as the API receives it) for one sandbox worker (module docstring, step 1)."""
    pod = copy.deepcopy(template if template is not None else load_template(config.pod.template))
    meta = pod.setdefault("metadata", {})
    prefix = str(meta.pop("generateName", "") or "trace-sandbox-")[:30]
    meta["name"] = f"{prefix}{_slug(label, 20)}-{worker_id[:10]}".lower()  # a DNS label: <= 63 characters
    meta["namespace"] = namespace
    meta["labels"] = {**(meta.get("labels") or {}), LABEL_WORKER: worker_id, LABEL_ENV: _slug(label, 63)}
    spec = pod.setdefault("spec", {})
    for key in ("initContainers", "ephemeralContainers"):
        if spec.get(key):
            raise _refuse(f"has {key}")
    for volume in spec.get("volumes") or []:
        kinds = [k for k in volume if k != "name"]
        if kinds != ["emptyDir"]:
            raise _refuse(f"mounts volume {volume.get('name')!r} of kind {', '.join(kinds) or 'none'}")
    containers = spec.get("containers") or []
    if len(containers) != 1:
        raise _refuse(f"has {len(containers)} containers (one, the worker, is expected)")
    (c,) = containers
    image = config.pod.image or c.get("image") or ""
    if not image:
        raise FailedPrecondition("no sandbox image: set TRACE_ENVIRONMENT_SANDBOX_POD_IMAGE or give the pod "
                                 "template's container an image")
    if c.get("envFrom"):
        raise _refuse("takes environment from envFrom")
    for var in c.get("env") or []:
        if "valueFrom" in var:
            raise _refuse(f"takes env {var.get('name')!r} from valueFrom")
    sc = c.get("securityContext") or {}
    if (sc.get("capabilities") or {}).get("add"):
        raise _refuse(f"adds capabilities {sc['capabilities']['add']}")
    worker_env = {"HOME": SCRATCH, "TMPDIR": SCRATCH, "PYTHONHASHSEED": str(config.hash_seed),
                  "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                  "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                  "TRACE_SANDBOX_CONFIG": config.worker_json(SCRATCH)}
    env = [v for v in c.get("env") or [] if v.get("name") not in worker_env]
    env += [{"name": k, "value": v} for k, v in worker_env.items()]
    limits = {**((c.get("resources") or {}).get("limits") or {}), "cpu": config.pod.cpu,
              "memory": f"{config.memory_mb}Mi"}
    requests = {k: v for k, v in ((c.get("resources") or {}).get("requests") or {}).items() if k != "memory"}
    requests["memory"] = f"{min(config.memory_mb, 256)}Mi"
    if "cpu" in requests and "cpu" in limits and _cpu_millis(requests["cpu"]) > _cpu_millis(limits["cpu"]):
        requests["cpu"] = limits["cpu"]
    mounts = [m for m in c.get("volumeMounts") or [] if m.get("mountPath") != SCRATCH]
    mounts.append({"name": "scratch", "mountPath": SCRATCH})
    container = {**{k: v for k, v in c.items() if k not in ("args", "workingDir", "envFrom", "tty", "stdinOnce")},
                 "name": CONTAINER, "image": image, "command": list(WORKER_COMMAND), "stdin": True, "stdinOnce": False,
                 "tty": False, "env": env, "resources": {"limits": limits, "requests": requests},
                 "volumeMounts": mounts, "workingDir": SCRATCH,
                 "securityContext": {**sc, "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                                     "runAsNonRoot": True, "privileged": False,
                                     "capabilities": {"drop": ["ALL"]},
                                     "seccompProfile": {"type": "RuntimeDefault"}}}
    volumes = [v for v in spec.get("volumes") or [] if v.get("name") != "scratch"]
    volumes.append({"name": "scratch", "emptyDir": {"sizeLimit": f"{config.pod.scratch_mb}Mi"}})
    psc = spec.get("securityContext") or {}
    spec.update({
        "containers": [container], "volumes": volumes, "restartPolicy": "Never",
        "activeDeadlineSeconds": config.pod.deadline_s, "automountServiceAccountToken": False,
        "enableServiceLinks": False, "hostNetwork": False, "hostPID": False, "hostIPC": False,
        "shareProcessNamespace": False,
        "securityContext": {**psc, "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    })
    return pod


def _cpu_millis(q: Any) -> float:
    text = str(q)
    return float(text[:-1]) if text.endswith("m") else float(text) * 1000


# -- facts -----------------------------------------------------------------------------------------

def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector (matchLabels + matchExpressions) against a pod's labels."""
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def egress_policy(policies: list[dict[str, Any]], labels: dict[str, str]) -> str | None:
    """The name of a NetworkPolicy that selects a pod with `labels` and allows it no egress."""
    for pol in policies:
        spec = pol.get("spec") or {}
        if "Egress" in (spec.get("policyTypes") or []) and not spec.get("egress") \
                and _selects(spec.get("podSelector") or {}, labels):
            return (pol.get("metadata") or {}).get("name") or "?"
    return None


def pod_facts(pod: dict[str, Any], policies: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The containment facts of a created pod (module docstring, step 3); policies None = unreadable."""
    spec = pod.get("spec") or {}
    psc = spec.get("securityContext") or {}
    containers = spec.get("containers") or []
    volumes = spec.get("volumes") or []

    def every(pred) -> bool:
        return bool(containers) and all(pred(c, c.get("securityContext") or {}) for c in containers)

    labels = (pod.get("metadata") or {}).get("labels") or {}
    facts: dict[str, Any] = {
        "no_service_account_token": spec.get("automountServiceAccountToken") is False,
        "no_secrets": all(set(v) <= {"name", "emptyDir"} for v in volumes)
        and every(lambda c, sc: not c.get("envFrom") and not any("valueFrom" in e for e in c.get("env") or [])),
        "read_only_root": every(lambda c, sc: sc.get("readOnlyRootFilesystem") is True),
        "non_root": every(lambda c, sc: sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True
                          and sc.get("runAsUser", psc.get("runAsUser")) != 0),
        "no_privilege_escalation": every(lambda c, sc: sc.get("allowPrivilegeEscalation") is False
                                         and not sc.get("privileged")),
        "capabilities_dropped": every(lambda c, sc: "ALL" in ((sc.get("capabilities") or {}).get("drop") or [])
                                      and not (sc.get("capabilities") or {}).get("add")),
        "seccomp_profile": every(lambda c, sc: ((sc.get("seccompProfile") or psc.get("seccompProfile") or {})
                                                .get("type") in ("RuntimeDefault", "Localhost"))),
        "own_namespaces": not (spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC")
                               or spec.get("shareProcessNamespace")),
        "limits": every(lambda c, sc: {"cpu", "memory"} <= set((c.get("resources") or {}).get("limits") or {})),
        "deadline": int(spec.get("activeDeadlineSeconds") or 0) > 0,
        "egress_denied": egress_policy(policies, labels) if policies is not None else None,
    }
    return facts


def facts_hold(facts: dict[str, Any], require_egress_policy: bool) -> list[str]:
    """The facts that do not hold (empty: the `pod` layer is in force)."""
    return [k for k, v in facts.items() if not v and (k != "egress_denied" or require_egress_policy)]


# -- the Kubernetes side ---------------------------------------------------------------------------

def default_api_client() -> Any:
    from kubernetes import client
    from kubernetes import config as kconfig

    try:
        kconfig.load_incluster_config()
    except kconfig.ConfigException:
        kconfig.load_kube_config()
    return client.ApiClient()


def default_namespace(config: SandboxConfig) -> str:
    if config.pod.namespace:
        return config.pod.namespace
    if SA_NAMESPACE.is_file():
        return SA_NAMESPACE.read_text().strip()
    return "default"


class _Discard:
    """Stands in for WSClient's capture-everything buffer (it would keep every byte ever read)."""

    def write(self, _data: Any) -> None:
        pass

    def getvalue(self) -> bytes:
        return b""


class PodTransport:
    """One sandbox worker in its own pod (module docstring); the `parent.Transport` of backend "kubernetes"."""

    def __init__(self, config: SandboxConfig, label: str):
        self.config, self.label = config, label
        self.namespace = default_namespace(config)
        self.worker_id = uuid.uuid4().hex[:16]
        self.name = ""
        self._api: Any = None
        self.core: Any = None
        self.net: Any = None
        self._ws: Any = None
        self._stderr = b""
        self._facts: dict[str, Any] = {}
        self._notes: list[str] = []
        self._ended = False

    # -- lifecycle ---------------------------------------------------------------------------------
    def open(self) -> None:
        from kubernetes import client
        from kubernetes.config import ConfigException

        try:
            self._api = (self.config.kubernetes_api or default_api_client)()
        except ConfigException as exc:
            raise Unavailable(f"TRACE_ENVIRONMENT_SANDBOX_BACKEND=kubernetes but no Kubernetes API is configured "
                              f"(neither in-cluster nor kubeconfig): {exc}") from exc
        self.core, self.net = client.CoreV1Api(self._api), client.NetworkingV1Api(self._api)
        manifest = build_pod(self.config, self.label, namespace=self.namespace, worker_id=self.worker_id)
        try:
            created = self.core.create_namespaced_pod(self.namespace, manifest)
        except client.ApiException as exc:
            raise Unavailable(f"could not create a sandbox pod in namespace {self.namespace}: {exc.status} "
                              f"{exc.reason}") from exc
        self.name = created.metadata.name
        try:
            self._wait_running()
            self._facts = pod_facts(self._as_dict(created), self._policies())
            self._attach()
        except BaseException:
            self.cleanup()
            raise

    def _as_dict(self, obj: Any) -> dict[str, Any]:
        return self._api.sanitize_for_serialization(obj)

    def _policies(self) -> list[dict[str, Any]] | None:
        from kubernetes import client

        try:
            items = self.net.list_namespaced_network_policy(self.namespace).items
        except client.ApiException as exc:
            self._notes.append(f"egress_denied unknown: cannot list NetworkPolicies in {self.namespace} "
                               f"({exc.status} {exc.reason}); grant the environment service list on networkpolicies")
            return None
        return [self._as_dict(p) for p in items]

    def _wait_running(self) -> None:
        from kubernetes import client

        deadline = time.monotonic() + self.config.startup_timeout_s
        last = "Pending"
        while True:
            try:
                pod = self.core.read_namespaced_pod(self.name, self.namespace)
            except client.ApiException as exc:
                raise Unavailable(f"sandbox pod {self.name} vanished while starting: {exc.status} {exc.reason}") from exc
            status = pod.status
            phase = (status.phase if status else None) or "Pending"
            for cs in (status.container_statuses or []) if status else []:
                state = cs.state
                if state is not None and state.running is not None:
                    return
                if state is not None and state.waiting is not None and state.waiting.reason in _FAILED_WAITING:
                    raise Unavailable(f"sandbox pod {self.name} cannot start: {state.waiting.reason}: "
                                      f"{state.waiting.message or ''}".rstrip(": "))
                if state is not None and state.terminated is not None:
                    raise Unavailable(f"sandbox pod {self.name} ended while starting: {state.terminated.reason} "
                                      f"(exit {state.terminated.exit_code})")
            if phase in ("Failed", "Succeeded"):
                raise Unavailable(f"sandbox pod {self.name} ended while starting: {phase} "
                                  f"{(status.reason or '') if status else ''}".rstrip())
            for cond in (status.conditions or []) if status else []:
                if cond.type == "PodScheduled" and cond.status == "False":
                    last = f"unschedulable: {cond.message or cond.reason}"
            if time.monotonic() > deadline:
                raise Unavailable(f"sandbox pod {self.name} did not start within {self.config.startup_timeout_s:g} s "
                                  f"({last}); raise TRACE_ENVIRONMENT_SANDBOX_STARTUP_TIMEOUT_S or check the node "
                                  "pool, image and quota")
            time.sleep(self.config.pod.poll_s)

    def _attach(self) -> None:
        from kubernetes import client
        from kubernetes.stream import stream

        try:
            self._ws = stream(self.core.connect_get_namespaced_pod_attach, self.name, self.namespace,
                              container=CONTAINER, stdin=True, stdout=True, stderr=True, tty=False,
                              _preload_content=False, binary=True)
        except client.ApiException as exc:
            raise Unavailable(f"cannot attach to sandbox pod {self.name}: {exc.status} {exc.reason}; the "
                              "environment service needs create on pods/attach") from exc
        if hasattr(self._ws, "_all"):
            self._ws._all = _Discard()

    # -- bytes -------------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if self._ws is None or not self._ws.is_open():
            raise BrokenPipeError("the sandbox pod's attach stream is closed")
        try:
            self._ws.write_stdin(data)
        except Exception as exc:  # noqa: BLE001 - websocket errors of every kind mean the stream is gone
            raise BrokenPipeError(str(exc)) from exc

    def _pump(self, timeout: float) -> None:
        try:
            self._ws.update(timeout=timeout)
        except Exception:  # noqa: BLE001 - a reset connection is the end of the stream
            self._ended = True
        err = self._take(2)
        if err:
            self._stderr = (self._stderr + err)[-16_000:]

    def _take(self, channel: int) -> bytes:
        """What the stream holds for `channel` already (no waiting)."""
        try:
            return self._ws.read_channel(channel, timeout=0) or b""
        except Exception:  # noqa: BLE001 - a reset connection is the end of the stream
            self._ended = True
            return b""

    def read(self, timeout: float) -> bytes | None:
        if self._ws is None:
            return b""
        for attempt in (0, 1):
            out = self._take(1)
            if out:
                return out
            if self._ended or not self._ws.is_open():
                return b""
            if attempt == 0:
                self._pump(timeout)
        return None

    def cpu_state(self) -> tuple[str, float] | None:
        return None  # the worker's /proc is in another pod

    def scratch_usage(self) -> None:
        return None  # the pod's scratch emptyDir has its sizeLimit (pod.scratch_mb): the kubelet evicts past it

    def alive(self) -> bool:
        return self._ws is not None and self._ws.is_open() and not self._ended

    def kill(self) -> None:
        self._delete()
        self.close_streams()

    def shutdown(self, line: bytes) -> None:
        try:
            self.write(line)
            deadline = time.monotonic() + 1.0
            while self.alive() and time.monotonic() < deadline:
                self._pump(0.2)
                self._take(1)
        except BrokenPipeError:
            pass

    def ending(self) -> dict[str, Any]:
        """How the container ended (poll its status a few seconds: the kubelet reports it after the stream ends)."""
        from kubernetes import client

        if self._ws is not None:
            self._pump(0)  # the last stderr frames (the supervisor's exit line)
        end: dict[str, Any] = dict(exit_report(self._stderr.decode("utf-8", "replace")) or {})
        deadline = time.monotonic() + 10
        while True:
            try:
                pod = self.core.read_namespaced_pod(self.name, self.namespace)
            except client.ApiException as exc:
                if exc.status == 404:
                    return {**end, "reason": "PodDeleted"}
                return {**end, "reason": "Unknown", "message": f"cannot read pod {self.name}: {exc.status}"}
            status = pod.status
            if status is not None and status.reason == "DeadlineExceeded":
                return {**end, "reason": "DeadlineExceeded"}
            for cs in (status.container_statuses or []) if status else []:
                term = cs.state.terminated if cs.state else None
                if term is not None:
                    code = term.exit_code
                    end.setdefault("code", code)
                    if "signal" not in end and code is not None and code > 128 and term.reason != "OOMKilled":
                        end["signal"] = code - 128
                    end.update(reason=term.reason or "", message=term.message or "",
                               oom_kills=1 if term.reason == "OOMKilled" else 0,
                               oom_evidence="the container's status is not OOMKilled")
                    return end
            if time.monotonic() > deadline:
                return {**end, "reason": "Unknown", "message": "the container status did not report an end"}
            time.sleep(self.config.pod.poll_s)

    def stderr_tail(self, limit: int = 2000) -> str:
        return self._stderr[-limit:].decode("utf-8", "replace").strip()

    def layers(self) -> dict[str, Any]:
        failing = facts_hold(self._facts, self.config.pod.require_egress_policy)
        notes = list(self._notes)
        if failing:
            notes.append(f"pod unavailable: {', '.join(failing)} not in force on pod {self.name}")
        return {"backend": "kubernetes", "pod": not failing, "pod_name": self.name, "pod_facts": self._facts,
                "notes": notes}

    def required_layers(self) -> tuple[str, ...]:
        return REQUIRED_POD_LAYERS

    def close_streams(self) -> None:
        if self._ws is not None:
            try:
                self._ws.close()
            except Exception:  # noqa: BLE001 - closing a dead socket
                pass
        self._ended = True

    def _delete(self) -> None:
        from kubernetes import client

        if not self.name or self.core is None:
            return
        try:
            self.core.delete_namespaced_pod(self.name, self.namespace, grace_period_seconds=0)
        except client.ApiException as exc:
            if exc.status != 404:
                raise Unavailable(f"could not delete sandbox pod {self.name}: {exc.status} {exc.reason}") from exc

    def cleanup(self) -> None:
        self.close_streams()
        try:
            self._delete()
        except Unavailable:
            pass
        self.name = ""
