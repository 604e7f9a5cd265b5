"""RBAC, the sandbox NetworkPolicy and the workload templates: who may do what, in which namespace.

The trainer may manage Jobs (and read pods/logs) in its own namespace and nothing else; the
environment service may manage sandbox pods; sandbox pods get no token and no network except
from the environment service. No cluster-scoped RBAC is ever rendered.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.chart.helm import FULLNAME, NAMESPACE, VALUE_SETS, render

SETS = sorted(VALUE_SETS)

ALLOWED_RULES = {
    "trainer": {("batch", "jobs"): {"create", "get", "list", "watch", "delete"},
                ("", "pods"): {"get", "list", "watch"},
                ("", "pods/log"): {"get", "list", "watch"}},
    "environment": {("", "pods"): {"create", "get", "list", "watch", "delete"},
                    ("", "pods/log"): {"get"},
                    ("", "pods/attach"): {"create", "get"},
                    # to check that a NetworkPolicy denying egress selects each sandbox pod (sandbox/pods.py)
                    ("networking.k8s.io", "networkpolicies"): {"get", "list"}},
}


def granted(role: dict) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "nonResourceURLs" not in rule and "resourceNames" not in rule
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                out.setdefault((group, res), set()).update(rule["verbs"])
    return out


@pytest.mark.parametrize("value_set", SETS)
def test_rbac_is_namespaced_and_minimal(value_set):
    r = render(value_set)
    assert not r.of_kind("ClusterRole") and not r.of_kind("ClusterRoleBinding")
    roles = {d["metadata"]["name"]: d for d in r.of_kind("Role")}
    for d in r.of_kind("RoleBinding"):
        assert d["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": d["metadata"]["name"]}
        assert d["subjects"] == [{"kind": "ServiceAccount", "name": d["metadata"]["name"], "namespace": NAMESPACE}]
        assert d["metadata"]["name"] in roles
    for name, role in roles.items():
        component = name.removeprefix(f"{FULLNAME}-")
        assert component in ALLOWED_RULES, f"unexpected Role {name}"
        assert role["metadata"]["namespace"] == NAMESPACE
        got = granted(role)
        assert "*" not in {v for verbs in got.values() for v in verbs}
        assert got == ALLOWED_RULES[component], f"{name}: {got}"
        # The bound ServiceAccount is the one the service's pods run as.
        dep = r.get("Deployment", name)
        assert dep["spec"]["template"]["spec"]["serviceAccountName"] == name


REPO = Path(__file__).resolve().parents[2]
#: The code of each service that calls the Kubernetes API with its own Role.
CALLERS = {"trainer": ("services/trainer",), "environment": ("services/environment",)}
#: kind in a client method's name -> (API group, resource); an unknown kind fails the test (add it here).
KINDS = {"job": ("batch", "jobs"), "pod": ("", "pods"), "network_policy": ("networking.k8s.io", "networkpolicies")}
#: method prefix -> the RBAC verbs the API server checks (a websocket attach is checked as get and, since
#: Kubernetes 1.30, create).
VERBS = {"create": {"create"}, "read": {"get"}, "list": {"list"}, "delete": {"delete"}, "patch": {"patch"},
         "replace": {"update"}, "connect_get": {"get", "create"}, "connect_post": {"create"}}
CALL = re.compile(r"\.(" + "|".join(sorted(VERBS, key=len, reverse=True)) + r")_namespaced_([a-z_]+)\(")


def api_calls(service: str) -> dict[tuple[str, str], set[str]]:
    """(group, resource[/subresource]) -> verbs, for every namespaced call of the official client in the
    service's code: `read_namespaced_job_status` is a get of jobs/status, a subresource RBAC checks apart."""
    needed: dict[tuple[str, str], set[str]] = {}
    for root in CALLERS[service]:
        for path in sorted((REPO / root).rglob("*.py")):
            for prefix, rest in CALL.findall(path.read_text()):
                kind, sub = (rest, "") if rest in KINDS else rest.rsplit("_", 1)
                assert kind in KINDS, f"{path.name}: {prefix}_namespaced_{rest}: add its kind to KINDS"
                group, resource = KINDS[kind]
                needed.setdefault((group, resource + (f"/{sub}" if sub else "")), set()).update(VERBS[prefix])
    return needed


@pytest.mark.parametrize("service", sorted(CALLERS))
def test_the_role_grants_every_call_the_service_makes(service):
    """kmock, the unit tests' API server, checks no RBAC: this is where a call outside the Role fails."""
    needed = api_calls(service)
    assert needed, f"no Kubernetes API call found in {CALLERS[service]}: has the code moved?"
    got = granted(render("defaults").get("Role", f"{FULLNAME}-{service}"))
    missing = {res: verbs - got.get(res, set()) for res, verbs in needed.items() if verbs - got.get(res, set())}
    assert not missing, f"the {service} Role does not grant {missing}"


def test_trainer_role_follows_the_trainer():
    assert render("defaults").has("Role", f"{FULLNAME}-trainer")
    assert not render("minimal").has("Role", f"{FULLNAME}-trainer")
    assert render("minimal").has("Role", f"{FULLNAME}-environment")


@pytest.mark.parametrize("value_set", ["defaults", "gpu-pools", "minimal"])
def test_sandbox_pods_are_isolated(value_set):
    r = render(value_set)
    pol = r.get("NetworkPolicy", f"{FULLNAME}-sandbox")["spec"]
    assert set(pol["policyTypes"]) == {"Ingress", "Egress"}
    assert pol["egress"] == []  # deny all egress, DNS included
    (pod,) = [m for m in r.embedded() if m["kind"] == "Pod"]
    labels = pod["metadata"]["labels"]
    assert pol["podSelector"]["matchLabels"].items() <= labels.items(), "policy does not select sandbox pods"
    # Ingress only from the environment service's pods.
    (ing,) = pol["ingress"]
    (peer,) = ing["from"]
    assert set(peer) == {"podSelector"}
    env_labels = r.get("Deployment", f"{FULLNAME}-environment")["spec"]["template"]["metadata"]["labels"]
    assert peer["podSelector"]["matchLabels"].items() <= env_labels.items()
    assert not peer["podSelector"]["matchLabels"].items() <= labels.items(), "sandboxes may not reach each other"
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert spec["serviceAccountName"] == f"{FULLNAME}-sandbox"
    assert r.get("ServiceAccount", f"{FULLNAME}-sandbox")["automountServiceAccountToken"] is False
    assert spec["restartPolicy"] == "Never" and spec["activeDeadlineSeconds"] > 0
    (c,) = spec["containers"]
    assert c["command"] == ["python", "-m", "services.environment.sandbox.worker"]
    assert c["resources"]["limits"]["memory"] and c["resources"]["limits"]["cpu"]
    # The environment service reads this template from the path it is told.
    env = {e["name"]: e for e in r.get("Deployment", f"{FULLNAME}-environment")["spec"]["template"]["spec"]
           ["containers"][0]["env"]}
    assert env["TRACE_ENVIRONMENT_SANDBOX_POD_TEMPLATE"]["value"] == "/etc/trace/templates/sandbox-pod.json"


def test_sandbox_runtime_class_is_optional():
    assert "runtimeClassName" not in next(m for m in render("defaults").embedded() if m["kind"] == "Pod")["spec"]
    assert next(m for m in render("gpu-pools").embedded() if m["kind"] == "Pod")["spec"]["runtimeClassName"] == "gvisor"


@pytest.mark.parametrize(("value_set", "gpus"), [("defaults", 1), ("gpu-pools", 8), ("gpu-off", 0)])
def test_training_job_template_runs_torchrun_on_the_trainer_pool(value_set, gpus):
    r = render(value_set)
    (job,) = [m for m in r.embedded() if m["kind"] == "Job"]
    spec = job["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == f"{FULLNAME}-training" and spec["automountServiceAccountToken"] is False
    assert spec["restartPolicy"] == "Never"
    (c,) = spec["containers"]
    assert c["command"][:4] == ["torchrun", "--standalone", "--nnodes=1", f"--nproc-per-node={max(gpus, 1)}"]
    assert c["command"][-2:] == ["-m", "services.trainer.worker"]   # the worker module (it exists: test_training_jobs)
    assert c["image"].endswith(r.get("Deployment", f"{FULLNAME}-trainer")["spec"]["template"]["spec"]
                               ["containers"][0]["image"].rpartition("/")[2])
    assert int(c["resources"].get("limits", {}).get("nvidia.com/gpu", 0)) == gpus
    assert job["spec"]["ttlSecondsAfterFinished"] > 0
