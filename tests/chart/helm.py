"""Renders charts/trace with the real helm binary and gives the tests typed views of the output.

Everything here runs real tools (helm, kubernetes-validate, promtool, hadolint from the project's
.tools/ and .venv/); a missing tool is a test failure that names the install command, never a
skip. Renders are cached per value set: one `helm template` per set per session.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "trace"
HELM = REPO / ".tools" / "bin" / "helm"
PROMTOOL = REPO / ".tools" / "bin" / "promtool"
VENV_BIN = REPO / ".venv" / "bin"
VALUES_DIR = Path(__file__).with_name("values")
RELEASE = "demo"
FULLNAME = "demo-trace"
NAMESPACE = "trace-ns"
#: The Kubernetes version manifests are validated against (kubernetes-validate -k).
KUBE_VERSION = "1.32.0"
SERVICES = ("rollout", "analysis", "environment", "trainer", "inference")

#: Value sets rendered by the tests: name -> values files under tests/chart/values/ (or absolute paths).
VALUE_SETS: dict[str, list[str]] = {
    "defaults": [],
    "external-minio": ["external-minio.yaml"],
    "gpu-off": ["gpu-off.yaml"],
    "gpu-pools": ["gpu-pools.yaml"],
    "monitoring": ["monitoring.yaml"],
    "minimal": ["minimal.yaml"],
    "tls": ["tls.yaml"],
    # the chart's example values for examples/tau2-retail-vllm.yaml, and the same without the adapter claim
    "tau2-retail-vllm": [str(CHART / "values-tau2-retail-vllm.yaml")],
    "tau2-retail-vllm-no-adapter-volume": [str(CHART / "values-tau2-retail-vllm.yaml"), "no-adapter-volume.yaml"],
}

#: Kinds from CRDs that kubernetes-validate has no schema for; checked structurally instead.
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}

#: Pod/Job manifests the chart renders inside ConfigMaps for the services to instantiate.
EMBEDDED_TEMPLATES = ("training-job.json", "sandbox-pod.json")


def require_tool(path: Path) -> Path:
    """The tool's path; fails the test (not skips) when the project's tool install is missing."""
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"{path} is missing: run scripts/install_tools.sh (and `pip install -e .[dev]`)",
                    pytrace=False)
    return path


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    """Runs helm with the project's binary; returns the completed process (no check)."""
    exe = require_tool(HELM)
    env = {**os.environ, "HELM_CACHE_HOME": "/tmp/trace-helm/cache", "HELM_CONFIG_HOME": "/tmp/trace-helm/config",
           "HELM_DATA_HOME": "/tmp/trace-helm/data"}
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120, env=env)


def value_args(value_set: str) -> list[str]:
    args: list[str] = []
    for f in VALUE_SETS[value_set]:
        args += ["-f", str(VALUES_DIR / f)]
    return args


def template(*args: str) -> subprocess.CompletedProcess[str]:
    return helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION, *args)


@dataclass(frozen=True)
class Rendered:
    """The manifests one value set renders."""

    value_set: str
    text: str
    docs: tuple[dict, ...]

    def of_kind(self, kind: str) -> list[dict]:
        return [d for d in self.docs if d["kind"] == kind]

    def get(self, kind: str, name: str) -> dict:
        found = [d for d in self.docs if d["kind"] == kind and d["metadata"]["name"] == name]
        assert len(found) == 1, f"{self.value_set}: expected one {kind} {name}, found {len(found)}"
        return found[0]

    def has(self, kind: str, name: str) -> bool:
        return any(d["kind"] == kind and d["metadata"]["name"] == name for d in self.docs)

    def embedded(self) -> list[dict]:
        """The Job/Pod manifests inside the workload-templates ConfigMap (parsed JSON)."""
        out = []
        for cm in self.of_kind("ConfigMap"):
            for key in EMBEDDED_TEMPLATES:
                if key in cm.get("data", {}):
                    out.append(json.loads(cm["data"][key]))
        return out


@functools.cache
def render(value_set: str) -> Rendered:
    proc = template(*value_args(value_set))
    if proc.returncode != 0:
        pytest.fail(f"helm template ({value_set}) failed:\n{proc.stderr}", pytrace=False)
    docs = tuple(d for d in yaml.safe_load_all(proc.stdout) if d)
    return Rendered(value_set, proc.stdout, docs)


@dataclass(frozen=True)
class PodSpec:
    """A pod spec found in the render: where it lives and its component label."""

    where: str  # e.g. "Deployment/demo-trace-rollout" or "ConfigMap:training-job.json"
    component: str
    spec: dict

    def containers(self) -> list[dict]:
        return [*self.spec.get("initContainers", []), *self.spec["containers"]]


def _pod_template(doc: dict) -> tuple[dict, dict] | None:
    kind = doc["kind"]
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        t = doc["spec"]["template"]
        return t.get("metadata", {}), t["spec"]
    if kind == "CronJob":
        t = doc["spec"]["jobTemplate"]["spec"]["template"]
        return t.get("metadata", {}), t["spec"]
    if kind == "Pod":
        return doc["metadata"], doc["spec"]
    return None


def pod_specs(r: Rendered) -> Iterator[PodSpec]:
    """Every pod spec: workloads, the bucket hook Job, and the embedded Job/Pod templates."""
    for doc, where in [*((d, f"{d['kind']}/{d['metadata']['name']}") for d in r.docs),
                       *((d, f"template:{d['kind']}") for d in r.embedded())]:
        found = _pod_template(doc)
        if found:
            meta, spec = found
            component = meta.get("labels", {}).get("app.kubernetes.io/component", "?")
            yield PodSpec(where, component, spec)


def gpu_request(container: dict) -> int:
    """nvidia.com/gpu of a container (limits; requests must match when both are set)."""
    res = container.get("resources", {})
    lim = int(res.get("limits", {}).get("nvidia.com/gpu", 0))
    req = int(res.get("requests", {}).get("nvidia.com/gpu", lim))
    assert req == lim, f"{container['name']}: nvidia.com/gpu requests {req} != limits {lim}"
    return lim
