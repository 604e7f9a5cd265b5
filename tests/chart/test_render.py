"""helm lint / helm template over every value set; every rendered manifest validated.

Built-in kinds (and the Job/Pod templates the chart embeds in a ConfigMap) go through
`kubernetes-validate --strict` for the pinned Kubernetes version, which rejects unknown fields.
kubernetes-validate has no schemas for the prometheus-operator CRDs (ServiceMonitor,
PrometheusRule), so those get a structural check here instead: the fields the operator needs,
selectors that really select a rendered Service port, and the rule file shipped verbatim.
"""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.chart.helm import (
    CHART,
    CRD_KINDS,
    FULLNAME,
    KUBE_VERSION,
    NAMESPACE,
    SERVICES,
    VALUE_SETS,
    VENV_BIN,
    helm,
    render,
    require_tool,
    template,
    value_args,
)

SETS = sorted(VALUE_SETS)


@pytest.mark.parametrize("value_set", SETS)
def test_helm_lint(value_set):
    proc = helm("lint", str(CHART), "--strict", "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION,
                *value_args(value_set))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("value_set", SETS)
def test_manifests_pass_kubernetes_validate_strict(value_set, tmp_path: Path):
    r = render(value_set)
    embedded = copy.deepcopy(r.embedded())
    for d in embedded:  # the services set the name; kubernetes-validate needs one (generateName is kept)
        d["metadata"].setdefault("name", d["metadata"]["generateName"] + "check")
    docs = [d for d in r.docs if d["kind"] not in CRD_KINDS] + embedded
    path = tmp_path / f"{value_set}.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    exe = require_tool(VENV_BIN / "kubernetes-validate")
    proc = subprocess.run([str(exe), "--strict", "-k", KUBE_VERSION, str(path)],
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, "\n".join(line for line in out.splitlines() if not line.startswith("INFO"))
    # Every document was checked against a schema (none silently unknown).
    assert "Couldn't find schema" not in out, out
    assert len(re.findall(r"^INFO .* passed for resource", out, re.M)) == len(docs), out


# What each value set must (and must not) render: (kind, name suffix) pairs.
EXPECTED = {
    "defaults": ({("StatefulSet", "minio"), ("Deployment", "vllm"), ("Job", "buckets"), ("Secret", "auth"),
                  ("Secret", "minio"), ("NetworkPolicy", "sandbox"), ("ConfigMap", "dashboard")},
                 {("ServiceMonitor", "rollout"), ("PrometheusRule", "alerts")}),
    "external-minio": ({("Job", "buckets"), ("Deployment", "vllm")},
                       {("StatefulSet", "minio"), ("Secret", "minio"), ("Secret", "auth")}),
    "gpu-off": ({("Deployment", "inference"), ("Deployment", "trainer")}, {("Deployment", "vllm")}),
    "gpu-pools": ({("Deployment", "vllm"), ("Deployment", "inference")}, set()),
    "monitoring": ({("ServiceMonitor", s) for s in (*SERVICES, "vllm")} | {("PrometheusRule", "alerts")}, set()),
    "minimal": ({("Deployment", "analysis"), ("Deployment", "environment"), ("ServiceMonitor", "analysis")},
                {("Deployment", "rollout"), ("Deployment", "trainer"), ("Deployment", "inference"),
                 ("Deployment", "vllm"), ("Role", "trainer"), ("ServiceMonitor", "vllm"),
                 ("ConfigMap", "dashboard")}),
    "tls": ({("Deployment", "rollout")}, set()),
    "tau2-retail-vllm": ({("Deployment", "vllm"), ("StatefulSet", "minio"), ("ConfigMap", "workload-templates")},
                         set()),
    "tau2-retail-vllm-no-adapter-volume": ({("Deployment", "vllm"), ("ConfigMap", "workload-templates")}, set()),
}


@pytest.mark.parametrize("value_set", SETS)
def test_value_set_renders_expected_resources(value_set):
    r = render(value_set)
    present, absent = EXPECTED[value_set]
    for kind, suffix in present:
        assert r.has(kind, f"{FULLNAME}-{suffix}"), f"{value_set}: {kind} {FULLNAME}-{suffix} missing"
    for kind, suffix in absent:
        assert not r.has(kind, f"{FULLNAME}-{suffix}"), f"{value_set}: {kind} {FULLNAME}-{suffix} rendered"
    for d in r.docs:
        if d["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert d["metadata"].get("namespace") == NAMESPACE, f"{d['kind']}/{d['metadata']['name']}: namespace"


def _check_service_monitor(sm: dict, services: list[dict]) -> list[str]:
    problems = []
    name = sm["metadata"].get("name", "?")
    spec = sm.get("spec", {})
    if sm.get("apiVersion") != "monitoring.coreos.com/v1":
        problems.append(f"{name}: apiVersion {sm.get('apiVersion')}")
    sel = spec.get("selector", {}).get("matchLabels")
    if not sel:
        problems.append(f"{name}: spec.selector.matchLabels missing")
        return problems
    if spec.get("namespaceSelector", {}).get("matchNames") != [NAMESPACE]:
        problems.append(f"{name}: namespaceSelector must name the release namespace")
    matched = [s for s in services if sel.items() <= s["metadata"]["labels"].items()]
    if len(matched) != 1:
        problems.append(f"{name}: selector matches {len(matched)} Services (want 1)")
        return problems
    ports = {p["name"] for p in matched[0]["spec"]["ports"]}
    endpoints = spec.get("endpoints") or []
    if not endpoints:
        problems.append(f"{name}: no endpoints")
    for ep in endpoints:
        allowed = {"port", "path", "interval", "scrapeTimeout", "relabelings", "scheme", "honorLabels", "authorization",
                   "tlsConfig"}  # fields of the operator's Endpoint type
        if set(ep) - allowed:
            problems.append(f"{name}: unexpected endpoint fields {sorted(set(ep) - allowed)}")
        if ep.get("port") not in ports:
            problems.append(f"{name}: endpoint port {ep.get('port')!r} is not a port of {matched[0]['metadata']['name']}")
        if ep.get("path") != "/metrics":
            problems.append(f"{name}: path {ep.get('path')!r}")
        for key in ("interval", "scrapeTimeout"):
            if not re.fullmatch(r"[0-9]+(ms|s|m|h)", str(ep.get(key, ""))):
                problems.append(f"{name}: {key} {ep.get(key)!r} is not a Prometheus duration")
        jobs = [rl for rl in ep.get("relabelings", []) if rl.get("targetLabel") == "job"]
        if len(jobs) != 1 or jobs[0].get("action") != "replace" or not str(jobs[0].get("replacement", "")).startswith("trace-"):
            problems.append(f"{name}: must relabel job to trace-<component> (the alert rules match on it)")
    return problems


def test_service_monitors_select_a_metrics_port():
    r = render("monitoring")
    sms = r.of_kind("ServiceMonitor")
    assert len(sms) == len(SERVICES) + 1
    problems = [p for sm in sms for p in _check_service_monitor(sm, r.of_kind("Service"))]
    assert not problems, "\n".join(problems)
    for sm in sms:
        assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_service_monitor_check_rejects_broken_monitors():
    """The structural check must be able to fail (a selector that selects nothing, a wrong port)."""
    r = render("monitoring")
    sm = yaml.safe_load(yaml.safe_dump(r.of_kind("ServiceMonitor")[0]))
    sm["spec"]["endpoints"][0]["port"] = "nope"
    sm["spec"]["endpoints"][0]["interval"] = "30"
    problems = _check_service_monitor(sm, r.of_kind("Service"))
    assert any("not a port" in p for p in problems) and any("duration" in p for p in problems), problems
    sm["spec"]["selector"]["matchLabels"] = {"app.kubernetes.io/component": "nothing"}
    assert any("matches 0 Services" in p for p in _check_service_monitor(sm, r.of_kind("Service")))


def test_prometheus_rule_ships_the_rules_file_verbatim():
    r = render("monitoring")
    (rule,) = r.of_kind("PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rules_file = yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())
    assert rule["spec"] == rules_file
    for group in rule["spec"]["groups"]:
        assert group["name"] and group["rules"]
        for rl in group["rules"]:
            assert ("alert" in rl) != ("record" in rl) and rl["expr"].strip(), rl


def test_dashboard_configmap_is_labelled_for_the_grafana_sidecar():
    r = render("monitoring")
    cm = r.get("ConfigMap", f"{FULLNAME}-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "TRACE"}
    assert cm["data"]["trace.json"].strip() == (CHART / "dashboards" / "trace.json").read_text().strip()


@pytest.mark.parametrize("tls, extra", [(False, ()), (True, ()), (True, ("--set", "tls.caKey=null"))],
                         ids=["plain", "tls", "tls-default-ca-key"])
def test_service_monitors_send_the_services_token_over_their_tls(tls, extra):
    """A TRACE service's /metrics needs its auth token: each of its ServiceMonitors sends the very Secret
    key the service's Deployment reads its token from, over HTTPS (trusting tls.caKey, ca.crt by default,
    checking the service's in-cluster name) when the services serve TLS, and the Service names the
    metrics port's protocol so. vLLM's /metrics is vLLM's: no token."""
    out = template(*value_args("monitoring"), *(value_args("tls") if tls else []), *extra)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert len(monitors) == len(SERVICES) + 1
    for sm in monitors:
        component = sm["metadata"]["labels"]["app.kubernetes.io/component"]
        (endpoint,) = sm["spec"]["endpoints"]
        if component == "vllm":
            assert not {"authorization", "scheme", "tlsConfig"} & set(endpoint), endpoint
            continue
        (deployment,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == f"{FULLNAME}-{component}"]
        (service,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == f"{FULLNAME}-{component}"]
        (port,) = [p for p in service["spec"]["ports"] if p["name"] == "metrics"]
        assert port["appProtocol"] == ("https" if tls else "http")
        (env,) = [e for c in deployment["spec"]["template"]["spec"]["containers"] for e in c.get("env", [])
                  if e["name"] == f"TRACE_{component.upper()}_AUTH_TOKEN"]
        assert endpoint["authorization"] == {"type": "Bearer", "credentials": env["valueFrom"]["secretKeyRef"]}
        if tls:
            assert endpoint["scheme"] == "https"
            assert endpoint["tlsConfig"] == {"ca": {"secret": {"name": "trace-grpc-tls", "key": "ca.crt"}},
                                             "serverName": f"{FULLNAME}-{component}"}
        else:
            assert "scheme" not in endpoint and "tlsConfig" not in endpoint
