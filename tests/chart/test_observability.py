"""Alert rules, the Grafana dashboard, and the metric names they use.

- `promtool check rules` on the rule file the chart ships, and `promtool test rules` with
  synthetic series (tests/chart/rules_test.yaml): each alert fires when it should, not before.
- The dashboard JSON is what its generator produces, has the required panels, and is
  well-formed for Grafana.
- Integration: every metric name the dashboard and the rules read is exported by the running
  services (a scrape of the embedded stack), and a real Prometheus scraping that stack under the
  chart's job names evaluates every dashboard query and rule expression without error.
"""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
import yaml

from tests.chart.helm import CHART, PROMTOOL, SERVICES, require_tool
from tests.chart.promql import dashboard_exprs, metric_names, rule_exprs, series_names

RULES = CHART / "files" / "prometheus-rules.yaml"
DASHBOARD = CHART / "dashboards" / "trace.json"
RULES_TEST = CHART.parents[1] / "tests" / "chart" / "rules_test.yaml"
#: Series Prometheus itself creates per scrape target (not exported by the services).
PROMETHEUS_SYNTHETIC = {"up"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(require_tool(PROMTOOL)), *args], capture_output=True, text=True, timeout=120)


def test_promtool_check_rules():
    proc = promtool("check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_promtool_rule_unit_tests():
    proc = promtool("test", "rules", str(RULES_TEST))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_required_alerts_exist():
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}
    assert {"TraceServiceDown", "TraceJobFailures", "TraceRolloutErrorRate", "TraceVLLMUnavailable",
            "TraceArtifactStoreErrors"} <= alerts
    vllm_rule = next(r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
                     if r.get("alert") == "TraceVLLMUnavailable")
    assert metric_names(vllm_rule["expr"]) == {"up"}  # vLLM's own metrics are not relied on


def test_dashboard_is_what_the_generator_writes():
    gen = CHART / "dashboards" / "generate_dashboard.py"
    proc = subprocess.run([sys.executable, str(gen), "--check"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_dashboard_structure():
    d = json.loads(DASHBOARD.read_text())
    panels = d["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["expr"].strip() and t["datasource"]["uid"] == "${datasource}", p["title"]
    # Panels do not overlap.
    cells = set()
    for p in panels:
        g = p["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"{p['title']} overlaps another panel"
        cells |= mine
    titles = {p["title"] for p in panels}
    for required in ("Jobs active by service and kind", "Jobs finished by service, kind and state", "Rollouts/s",
                     "Pass rate by environment", "Reward (mean) per capability", "Pass rate per capability",
                     "Informative group fraction", "Loss and KL", "Tokens routed per expert",
                     "RPC latency p95 per service", "RPC error rate per service"):
        assert required in titles, required
    # Per-service panels cover all five services.
    rpc = next(p for p in panels if p["title"] == "RPC latency p95 per service")
    assert {s for s in SERVICES if any(f"trace_{s}_rpc_duration_seconds_bucket" in t["expr"] for t in rpc["targets"])} \
        == set(SERVICES)
    assert d["templating"]["list"][0]["type"] == "datasource"


@pytest.mark.parametrize(("expr", "names"), [
    ('sum by (le) (rate(trace_rollout_rpc_duration_seconds_bucket{namespace=~"$namespace"}[$__rate_interval]))',
     {"trace_rollout_rpc_duration_seconds_bucket"}),
    ('histogram_quantile(0.95, sum(rate(a_bucket[5m])) by (le))', {"a_bucket"}),
    ('sum(rate(x_total{code=~"UNKNOWN|INTERNAL"}[5m])) / sum(rate(x_total[5m])) > 0.05', {"x_total"}),
    ('up{job=~"trace-(rollout|vllm)"} == 0', {"up"}),
    ('label_values(trace_build_info, namespace)', {"trace_build_info"}),
    ('rate(a[5m] offset 1h) * on(instance) group_left(version) b', {"a", "b"}),
    ('trace:jobs_failed:increase15m > 0', {"trace:jobs_failed:increase15m"}),
    ('label_replace(c, "service", "rollout", "", "")', {"c"}),
    ('1e-9 + d and ignoring(x) e unless f', {"d", "e", "f"}),
    ('sum by (expert) (increase(t_total[$__range]))', {"t_total"}),
    ('vector(1)', set()),
])
def test_metric_name_extraction(expr, names):
    assert metric_names(expr) == names


def test_series_names_of_an_exposition():
    text = ("# HELP a_total A.\n# TYPE a_total counter\n"
            "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 0\nh_bucket{le=\"+Inf\"} 0\nh_count 0\nh_sum 0\n"
            "# HELP g G.\n# TYPE g gauge\ng 1\n")
    names = series_names(text)
    assert {"a_total", "h_bucket", "h_count", "h_sum", "g"} <= names
    assert "a" not in names and "h" not in names


def used_metric_names() -> tuple[set[str], set[str]]:
    """(names read by the dashboard and rules, names the rules record)."""
    exprs, recorded = rule_exprs(RULES)
    used = set().union(*(metric_names(e) for e in exprs + dashboard_exprs(DASHBOARD)))
    return used, recorded


@pytest.mark.integration
def test_every_metric_used_is_exported_by_the_running_services(embedded_stack):
    urls = embedded_stack.metrics_urls
    assert set(urls) == set(SERVICES)
    exported: set[str] = set()
    for service, url in urls.items():
        resp = httpx.get(url, timeout=10)
        resp.raise_for_status()
        names = series_names(resp.text)
        assert "trace_build_info" in names, service
        exported |= names
    used, recorded = used_metric_names()
    assert len(used) > 30, sorted(used)  # the extraction found the dashboard's and rules' names
    missing = used - exported - recorded - PROMETHEUS_SYNTHETIC
    assert not missing, f"used by the dashboard/rules but exported by no service: {sorted(missing)}"


def _substitute_grafana_vars(expr: str) -> str:
    return (expr.replace("$__rate_interval", "1m").replace("$__range", "1h")
            .replace('namespace=~"$namespace"', 'namespace=~".*"'))


@pytest.mark.integration
def test_prometheus_evaluates_every_query_against_the_running_services(embedded_stack, prometheus_factory):
    prom = prometheus_factory({f"trace-{s}": url for s, url in embedded_stack.metrics_urls.items()})
    # The service-down alert's selector matches the chart's job names, and all five are up.
    (rule,) = [e for e in rule_exprs(RULES)[0] if e.startswith("up{job=~\"trace-(")]
    up = prom.wait_for(rule.replace("== 0", "== 1"), lambda r: len(r) == len(SERVICES), timeout=60)
    assert {s["metric"]["job"] for s in up} == {f"trace-{s}" for s in SERVICES}
    assert prom.query("trace_build_info"), "trace_build_info not scraped"
    failures = []
    for expr in dashboard_exprs(DASHBOARD) + rule_exprs(RULES)[0]:
        if expr.startswith("label_values("):
            continue
        try:
            prom.query(_substitute_grafana_vars(expr))
        except httpx.HTTPStatusError as err:
            failures.append(f"{expr}: {err.response.text}")
    assert not failures, "\n".join(failures)
