"""The evaluation stage: every arm on the held-out split under the same budget rules.

Arms (each a rollout job on `evaluation.split`, greedy unless configured otherwise):
  base               the base agent
  best_single        the capability adapter with the best pass rate on the *dev* split
                     (chosen without looking at the test split), evaluated on test
  grpo_target        GRPO directly on the target's training tasks with the same number of
                     training rollouts as TRACE spent (adapters + gates), then evaluated;
                     the adapters' GRPO config without guided rollouts (the target has no hints)
  gepa               the base agent with a system prompt optimised by the `gepa` package
                     (reflection LLM required; same rollout budget)
  trace_routing      base + adapters + gates, token-level top-1 routing
  trace_per_request  the same composition exported as one adapter per request

Every arm records pass rate with a 95 % Wilson interval, per-capability breakdown (from the
trajectories' task metadata), training rollouts spent and wall time. Each arm (and each dev
rollout, and the GRPO arm's training job) is a unit of the stage (`Pipeline.unit`): recorded in
the manifest when it finishes, so a run killed in the middle of the evaluation keeps the arms
it finished.
"""

from __future__ import annotations

import math
import time
from typing import Any

from trace_common.grpc.client import messages
from tracectl.run.arm_results import breakdown, training_rollouts
from tracectl.run.jobs import StageFailed

T = messages("trainer")


def evaluate(p) -> dict[str, Any]:
    ev = p.cfg.evaluation
    m = p.manifest
    adapters: dict[str, str] = m.stages["adapters"].outputs
    adapter_metrics = m.stages["adapters"].result.get("metrics", {})
    trace_budget = sum(training_rollouts(adapter_metrics.get(c, {}), p.cfg.training.grpo) for c in adapters)
    gates_out = m.stages["gates"].outputs
    trace_budget += training_rollouts(m.stages["gates"].result.get("metrics", {}), p.cfg.gates.config)
    arms: dict[str, dict[str, Any]] = {}
    jobs: list[str] = []

    def test_arm(name: str, policy, spent: int, extra: dict[str, Any] | None = None) -> None:
        def work() -> dict[str, Any]:
            started = time.time()
            res = p.rollout(policy, ev.split, ev.limit, 1, ev.temperature, f"eval {name}")
            res.update(training_rollouts=spent, breakdown=breakdown(p.store, res["uri"]), **(extra or {}))
            res["wall_seconds_total"] = res.get("train_seconds", 0.0) + (time.time() - started)
            return res
        arms[name] = p.unit("evaluation", f"arm {name}", work)   # an arm a killed attempt finished is kept
        jobs.append(arms[name]["job"])

    for arm in ev.arms:
        if arm == "base":
            test_arm("base", p.base_policy(), 0)
        elif arm == "best_single":
            dev = {cap: p.unit("evaluation", f"dev {cap}",
                               lambda cap=cap, uri=uri: p.rollout(p.base_policy(adapter_uri=uri), "dev", ev.limit, 1,
                                                                  ev.temperature, f"dev {cap}"))["pass_rate"]
                   for cap, uri in adapters.items()}
            best = max(sorted(dev), key=lambda c: dev[c])
            test_arm("best_single", p.base_policy(adapter_uri=adapters[best]),
                     training_rollouts(adapter_metrics.get(best, {}), p.cfg.training.grpo),
                     {"adapter": best, "dev_pass_rates": dev})
        elif arm == "grpo_target":
            # the adapters' GRPO settings, unguided: the target supplies no hints (asking would fail the job)
            cfg = {**p.cfg.training.grpo, "guidance_fraction": 0.0}
            per_step = cfg.get("groups_per_batch", 4) * cfg.get("num_generations", 8)
            cfg["max_steps"] = max(1, math.ceil(trace_budget / per_step))

            def train(cfg=cfg) -> dict[str, Any]:
                started = time.time()
                resp = p.train(T.TRAINING_KIND_ADAPTER, "target_grpo", [p.target_ref()], cfg, "GRPO on target tasks")
                return {"job": resp.job.job_id, "uri": next(o.uri for o in resp.job.outputs if o.kind == "adapter"),
                        "rollouts": training_rollouts(dict(resp.job.metrics), cfg),
                        "train_seconds": time.time() - started}
            trained = p.unit("evaluation", "train grpo_target", train)
            test_arm("grpo_target", p.base_policy(adapter_uri=trained["uri"]), trained["rollouts"],
                     {"adapter_uri": trained["uri"], "train_seconds": trained["train_seconds"]})
            jobs.append(trained["job"])
        elif arm in ("trace_routing", "trace_per_request"):
            comp = gates_out.get("composition")
            if not comp:
                raise StageFailed("gate training produced no composition artifact; cannot evaluate TRACE")
            routing = "token" if arm == "trace_routing" else "per_request"
            test_arm(arm, p.base_policy(composition_uri=comp, routing=routing), trace_budget)
        elif arm == "gepa":
            from tracectl.run.gepa_arm import run_gepa

            res = p.unit("evaluation", "arm gepa", lambda: run_gepa(p, budget=trace_budget))
            arms["gepa"] = res
            jobs.extend(res.get("jobs", []))
    result: dict[str, Any] = {"arms": arms, "trace_training_rollouts": trace_budget}
    if "trace_routing" in arms and gates_out.get("composition"):
        from tracectl.run.routing import routing_usage

        usage = routing_usage(p.runner.conn.stub("inference"), p.store, gates_out["composition"],
                              arms["trace_routing"]["uri"], name=f"{p.cfg.run_id}-moe")
        result["routed_example"] = usage.pop("routed_example")
        result["expert_usage"] = usage
    return {"jobs": jobs, "result": result}
