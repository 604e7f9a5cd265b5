"""Generates dashboards/trace.json, the TRACE Grafana dashboard the chart ships as a ConfigMap.

Why generated: the RPC and job panels repeat one query per service (each service has its own
metric family, trace_<service>_rpc_requests_total ...), and hand-editing five copies of every
query drifts. The chart tests re-run this generator and fail when trace.json differs, and check
that every metric it names is exported by the running services.

    python charts/trace/dashboards/generate_dashboard.py          # rewrite trace.json
    python charts/trace/dashboards/generate_dashboard.py --check  # exit 1 if trace.json is stale

Standalone on purpose (standard library only): it must not import the services it describes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUT = Path(__file__).with_name("trace.json")
SERVICES = ("rollout", "analysis", "environment", "trainer", "inference")
DS = {"type": "prometheus", "uid": "${datasource}"}
NS = 'namespace=~"$namespace"'
RATE = "$__rate_interval"
#: Artifact-store outcomes that are store failures (not_found etc. are the caller's business).
STORE_ERRORS = "error|unavailable|corrupted"


def target(expr: str, legend: str, ref: str) -> dict:
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref, "range": True}


def panel(title: str, description: str, targets: list[tuple[str, str]], *, kind: str = "timeseries",
          unit: str = "short", width: int = 12, height: int = 8, stack: bool = False,
          minmax: tuple[float, float] | None = None) -> dict:
    defaults: dict = {"unit": unit, "custom": {}}
    if kind == "timeseries":
        defaults["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10 if stack else 0,
                              "showPoints": "never", "spanNulls": True,
                              "stacking": {"mode": "normal" if stack else "none", "group": "A"}}
    if minmax is not None:
        defaults["min"], defaults["max"] = minmax
    p = {"type": kind, "title": title, "description": description, "datasource": DS,
         "fieldConfig": {"defaults": defaults, "overrides": []},
         "targets": [target(e, legend, chr(ord("A") + i)) for i, (e, legend) in enumerate(targets)],
         "_size": (width, height)}
    if kind == "timeseries":
        p["options"] = {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull"]},
                        "tooltip": {"mode": "multi", "sort": "desc"}}
    elif kind == "piechart":
        p["options"] = {"legend": {"displayMode": "table", "placement": "right", "values": ["percent"]},
                        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "pieType": "donut"}
    elif kind in ("stat", "bargauge"):
        p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}
    elif kind == "table":
        p["options"] = {"showHeader": True}
        for t in p["targets"]:
            t.update(format="table", instant=True, range=False)
    return p


def per_service(fmt: str, legend: str) -> list[tuple[str, str]]:
    """One query per service: `fmt` uses {s} for the service name."""
    return [(fmt.format(s=s), legend.format(s=s)) for s in SERVICES]


def rows() -> list[tuple[str, list[dict]]]:
    pipeline = [
        panel("Services up", "Scrape health of each TRACE service (1 = up).",
              [(f'up{{job=~"trace-.*", {NS}}}', "{{job}} {{instance}}")], kind="stat", width=8),
        panel("Build", "Version of every running service process (trace_build_info).",
              [(f"trace_build_info{{{NS}}}", "")], kind="table", width=16),
        panel("Jobs active by service and kind", "Pipeline stage status: jobs PENDING or RUNNING now.",
              per_service(f"sum by (kind) (trace_{{s}}_jobs_active{{{{{NS}}}}})", "{s} {{{{kind}}}}"),
              stack=True),
        panel("Jobs finished by service, kind and state", "Jobs that reached a final state (per hour).",
              per_service(f"sum by (kind, state) (increase(trace_{{s}}_jobs_total{{{{{NS}}}}}[1h]))",
                          "{s} {{{{kind}}}} {{{{state}}}}"), stack=True),
    ]
    rollout = [
        panel("Rollouts/s", "Episodes finished per second, by environment and outcome.",
              [(f"sum by (env, outcome) (rate(trace_rollout_episodes_total{{{NS}}}[{RATE}]))",
                "{{env}} {{outcome}}")], unit="ops", stack=True),
        panel("Pass rate by environment", "Fraction of finished episodes that succeeded.",
              [(f'sum by (env) (rate(trace_rollout_episodes_total{{outcome="success", {NS}}}[{RATE}]))'
                f" / sum by (env) (rate(trace_rollout_episodes_total{{{NS}}}[{RATE}]))", "{{env}}")],
              unit="percentunit", minmax=(0, 1)),
        panel("Mean episode reward by environment", "Mean reward in [0, 1] of finished episodes.",
              [(f"sum by (env) (rate(trace_rollout_episode_reward_sum{{{NS}}}[{RATE}]))"
                f" / sum by (env) (rate(trace_rollout_episode_reward_count{{{NS}}}[{RATE}]))", "{{env}}")],
              minmax=(0, 1)),
        panel("Policy errors and episode time", "Policy failures by reason; p95 episode wall time.",
              [(f"sum by (reason) (rate(trace_rollout_policy_errors_total{{{NS}}}[{RATE}]))", "{{reason}}/s"),
               (f"histogram_quantile(0.95, sum by (le) (rate(trace_rollout_episode_duration_seconds_bucket"
                f"{{{NS}}}[{RATE}])))", "p95 episode seconds")]),
        panel("Rollout tokens/s", "Tokens processed by the policy, by kind.",
              [(f"sum by (kind) (rate(trace_rollout_tokens_total{{{NS}}}[{RATE}]))", "{{kind}}")]),
        panel("Episodes in flight", "Episodes being played now (rollout) and open sandbox episodes.",
              [(f"sum(trace_rollout_episodes_active{{{NS}}})", "rollout"),
               (f"sum(trace_environment_episodes_open{{{NS}}})", "environment sandboxes")]),
    ]
    training = [
        panel("Reward (mean) per capability", "Mean rollout reward of the last GRPO iteration.",
              [(f"trace_trainer_reward_mean{{{NS}}}", "{{capability}}")], minmax=(0, 1)),
        panel("Pass rate per capability", "Pass rate of the last GRPO iteration's rollouts.",
              [(f"trace_trainer_pass_rate{{{NS}}}", "{{capability}}")], unit="percentunit", minmax=(0, 1)),
        panel("Informative group fraction", "Fraction of GRPO groups with unequal rewards: no signal "
              "without them (the first number to watch).",
              [(f"trace_trainer_informative_group_fraction{{{NS}}}", "{{capability}}")],
              unit="percentunit", minmax=(0, 1)),
        panel("Loss and KL", "Policy loss and KL to the frozen base of the last iteration.",
              [(f"trace_trainer_loss{{{NS}}}", "loss {{capability}}"),
               (f"trace_trainer_kl{{{NS}}}", "kl {{capability}}")]),
        panel("Iterations and step time", "GRPO iterations per minute; p50 iteration wall time.",
              [(f"sum by (capability) (rate(trace_trainer_iterations_total{{{NS}}}[{RATE}])) * 60",
                "iter/min {{capability}}"),
               (f"histogram_quantile(0.5, sum by (le, capability) (rate(trace_trainer_step_duration_seconds_bucket"
                f"{{{NS}}}[{RATE}])))", "p50 s {{capability}}")]),
        panel("Trained tokens/s and adapter loads", "Tokens trained on; adapter hot-loads into vLLM by outcome.",
              [(f"sum by (capability) (rate(trace_trainer_tokens_total{{{NS}}}[{RATE}]))", "tok/s {{capability}}"),
               (f"sum by (outcome) (increase(trace_trainer_adapter_loads_total{{{NS}}}[1h]))",
                "adapter loads/h {{outcome}}")]),
    ]
    analysis_env = [
        panel("Capabilities decided", "Candidate capabilities retained or rejected by the analysis.",
              [(f"sum by (outcome) (trace_analysis_capabilities_total{{{NS}}})", "{{outcome}}")],
              kind="bargauge", width=8),
        panel("Labels by value", "Trajectory x capability labels assigned (NA, PRESENT, LACKING).",
              [(f"sum by (label, mode) (rate(trace_analysis_labels_total{{{NS}}}[{RATE}]))", "{{label}} {{mode}}")],
              width=8),
        panel("Analyst LLM requests", "Analyst LLM requests by outcome; p95 request time.",
              [(f"sum by (outcome) (rate(trace_analysis_llm_requests_total{{{NS}}}[{RATE}]))", "{{outcome}}/s"),
               (f"histogram_quantile(0.95, sum by (le) (rate(trace_analysis_llm_request_duration_seconds_bucket"
                f"{{{NS}}}[{RATE}])))", "p95 s")], width=8),
        panel("Environment validations", "Generated environments validated, by mode and status.",
              [(f"sum by (mode, status) (increase(trace_environment_validations_total{{{NS}}}[1h]))",
                "{{mode}} {{status}}")], width=8),
        panel("Sandbox violations", "Sandbox limits hit, by kind (per hour).",
              [(f"sum by (kind) (increase(trace_environment_sandbox_violations_total{{{NS}}}[1h]))", "{{kind}}")],
              width=8),
        panel("Sandbox step latency", "p50/p95 round trip of one env call through the sandbox.",
              [(f"histogram_quantile({q}, sum by (le) (rate(trace_environment_sandbox_step_duration_seconds_bucket"
                f"{{{NS}}}[{RATE}])))", f"p{int(q * 100)}") for q in (0.5, 0.95)], unit="s", width=8),
    ]
    inference = [
        panel("Tokens routed per expert", "Token-layer routing decisions per second, by expert "
              "(base or capability adapter).",
              [(f"sum by (expert) (rate(trace_inference_tokens_routed_total{{{NS}}}[{RATE}]))", "{{expert}}")],
              stack=True, width=16),
        panel("Routing share", "Share of token-layer decisions per expert over the range.",
              [(f"sum by (expert) (increase(trace_inference_tokens_routed_total{{{NS}}}[$__range]))", "{{expert}}")],
              kind="piechart", width=8),
        panel("Inference tokens/s", "Generated and prompt tokens per second.",
              [(f"sum(rate(trace_inference_generated_tokens_total{{{NS}}}[{RATE}]))", "generated"),
               (f"sum(rate(trace_inference_prompt_tokens_total{{{NS}}}[{RATE}]))", "prompt")], width=8),
        panel("Inference latency", "p95 request time by API and p95 time to first token.",
              [(f"histogram_quantile(0.95, sum by (le, api) (rate(trace_inference_request_duration_seconds_bucket"
                f"{{{NS}}}[{RATE}])))", "p95 {{api}}"),
               (f"histogram_quantile(0.95, sum by (le) (rate(trace_inference_time_to_first_token_seconds_bucket"
                f"{{{NS}}}[{RATE}])))", "p95 TTFT")], unit="s", width=8),
        panel("Inference load", "Requests in flight and compositions loaded.",
              [(f"sum(trace_inference_requests_active{{{NS}}})", "requests in flight"),
               (f"sum(trace_inference_compositions_loaded{{{NS}}})", "compositions loaded")], width=8),
    ]
    rpc = [
        panel("RPC latency p95 per service", "95th percentile RPC handling time (all methods).",
              per_service(f"histogram_quantile(0.95, sum by (le) (rate(trace_{{s}}_rpc_duration_seconds_bucket"
                          f"{{{{{NS}}}}}[{RATE}])))", "{s}"), unit="s"),
        panel("RPC latency p50 per service", "Median RPC handling time (all methods).",
              per_service(f"histogram_quantile(0.5, sum by (le) (rate(trace_{{s}}_rpc_duration_seconds_bucket"
                          f"{{{{{NS}}}}}[{RATE}])))", "{s}"), unit="s"),
        panel("RPC error rate per service", "Fraction of RPCs ending with a non-OK status code.",
              per_service(f'sum(rate(trace_{{s}}_rpc_requests_total{{{{code!="OK", {NS}}}}}[{RATE}]))'
                          f" / sum(rate(trace_{{s}}_rpc_requests_total{{{{{NS}}}}}[{RATE}]))", "{s}"),
              unit="percentunit"),
        panel("RPC rate by service and code", "RPCs per second by final status code.",
              per_service(f"sum by (code) (rate(trace_{{s}}_rpc_requests_total{{{{{NS}}}}}[{RATE}]))",
                          "{s} {{{{code}}}}"), unit="reqps", stack=True),
        panel("Artifact store errors", "Failed artifact-store operations per second, by service and op.",
              per_service(f'sum by (op) (rate(trace_{{s}}_artifact_operations_total{{{{outcome=~"{STORE_ERRORS}", {NS}}}}}'
                          f"[{RATE}]))", "{s} {{{{op}}}}"), unit="ops"),
        panel("Artifact throughput", "Bytes moved through the artifact store per second, by service.",
              per_service(f"sum(rate(trace_{{s}}_artifact_bytes_total{{{{{NS}}}}}[{RATE}]))", "{s}"),
              unit="Bps"),
    ]
    return [("Pipeline", pipeline), ("Rollouts", rollout), ("Training (GRPO per capability)", training),
            ("Analysis and environments", analysis_env), ("Inference and MoE routing", inference),
            ("RPC and artifacts", rpc)]


def layout(sections: list[tuple[str, list[dict]]]) -> list[dict]:
    """Rows of panels on Grafana's 24-column grid, left to right, wrapping."""
    panels, y, pid = [], 0, 1
    for title, items in sections:
        panels.append({"type": "row", "title": title, "collapsed": False, "id": pid, "panels": [],
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        pid, y, x, row_h = pid + 1, y + 1, 0, 0
        for p in items:
            w, h = p.pop("_size")
            if x + w > 24:
                x, y, row_h = 0, y + row_h, 0
            p["id"] = pid
            p["gridPos"] = {"h": h, "w": w, "x": x, "y": y}
            panels.append(p)
            pid, x, row_h = pid + 1, x + w, max(row_h, h)
        y += row_h
    return panels


def dashboard() -> dict:
    return {
        "title": "TRACE",
        "uid": "trace-overview",
        "description": "TRACE pipeline: stage status, rollouts, GRPO training per capability, analysis, "
                       "environments, MoE routing, RPC latency and errors per service.",
        "tags": ["trace", "llm", "grpo"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "time": {"from": "now-6h", "to": "now"},
        "timezone": "",
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0, "refresh": 1},
            {"name": "namespace", "label": "Namespace", "type": "query", "datasource": DS,
             "query": {"query": "label_values(trace_build_info, namespace)", "refId": "namespace"},
             "definition": "label_values(trace_build_info, namespace)",
             "includeAll": True, "allValue": ".*", "multi": True, "current": {}, "hide": 0, "refresh": 2,
             "sort": 1},
        ]},
        "panels": layout(rows()),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if trace.json differs from the generator")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run python {Path(__file__).as_posix()}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
