"""The TRACE loop as resumable stages, each one service call (or a few in parallel).

    rollout      base agent on the target's training tasks            -> trajectories
    analysis     contrastive capability analysis                      -> retained capabilities
    environments one validated environment per retained capability   -> environment records
    adapters     one GRPO LoRA adapter per capability (parallel jobs) -> adapter URIs
    gates        gate-only training of the MoE over frozen adapters   -> composition
    evaluation   every arm on the held-out split, same budget rules   -> pass rates with CIs
    report       markdown + self-contained HTML with plots            -> report files

Each stage reads what earlier stages recorded in the manifest, and records its own outputs
there (see manifest.py for the resume rule). Nothing here computes a model: all work is done
by the services through their gRPC APIs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Struct
from rich.console import Console

from trace_common.artifacts import ArtifactStore
from trace_common.grpc.client import messages
from trace_common.proto.trace.v1 import types_pb2 as t
from tracectl.run.config import RunConfig
from tracectl.run.jobs import JobRunner, StageFailed
from tracectl.run.manifest import STAGES, Manifest, config_hash

console = Console(stderr=True)
R, A, E, T = (messages(s) for s in ("rollout", "analysis", "environment", "trainer"))


def _struct(d: dict[str, Any]) -> t.Config:
    s = Struct()
    s.update(d)
    return t.Config(values=s)


@dataclass
class Pipeline:
    cfg: RunConfig
    runner: JobRunner
    store: ArtifactStore
    manifest: Manifest

    # -- shared pieces ---------------------------------------------------------------------
    def target_ref(self, **params: str) -> t.EnvironmentRef:
        tg = self.cfg.target
        uri = tg.uri if (not tg.uri or tg.uri.startswith(("file://", "s3://"))) else f"file://{tg.uri}"
        return t.EnvironmentRef(name=tg.env, uri=uri, params={**tg.params, **params})

    def base_policy(self, **kw: str) -> t.PolicyRef:
        b = self.cfg.base_agent
        backend = t.POLICY_BACKEND_OPENAI_HTTP if b.backend == "http" else t.POLICY_BACKEND_IN_PROCESS
        return t.PolicyRef(backend=backend, model=b.name, endpoint=b.endpoint, **kw)

    def user_simulator(self) -> t.LlmEndpoint | None:
        u = self.cfg.target.user_simulator
        return t.LlmEndpoint(base_url=u.base_url, model=u.model, api_key_env=u.api_key_env) if u else None

    def rollout(self, policy: t.PolicyRef, split: str, limit: int, samples: int, temperature: float,
                label: str, seed: int = 0) -> dict[str, Any]:
        spec = R.RolloutSpec(environment=self.target_ref(), policy=policy,
                             tasks=R.TaskSelection(split=split, limit=limit), samples_per_task=samples,
                             sampling=t.SamplingParams(temperature=temperature, seed=seed),
                             concurrency=self.cfg.rollout.concurrency, seed=seed + self.cfg.seed)
        if self.cfg.target.user_simulator:
            spec.user_simulator.CopyFrom(self.user_simulator())
        resp = self.runner.run("rollout", spec, self.cfg.run_id, label, labels={"stage": label[:60]})
        s = resp.summary
        return {"job": resp.job.job_id, "uri": next(o.uri for o in resp.job.outputs if o.kind == "trajectories"),
                "episodes": s.episodes, "successes": s.successes, "pass_rate": s.pass_rate,
                "ci": [s.pass_rate_ci_low, s.pass_rate_ci_high], "reward_mean": s.reward_mean,
                "wall_seconds": (resp.job.end_time.ToNanoseconds() - resp.job.start_time.ToNanoseconds()) / 1e9}

    def unit(self, stage: str, key: str, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """`work()` once per stage attempt chain: its result is recorded in the manifest as soon as it
        returns, and a re-run of the stage after a kill or failure (same config) reuses it instead of
        running it again (manifest.py: `partial`). The result must be JSON-serialisable."""
        rec = self.manifest.stages[stage]
        if key in rec.partial:
            console.print(f"[dim]{stage}: {key} done earlier, reused[/]")
            return rec.partial[key]
        out = work()
        rec.partial[key] = out
        self.manifest.save(self.store)
        return out

    # -- stages ------------------------------------------------------------------------------
    def stage_rollout(self) -> dict[str, Any]:
        r = self.cfg.rollout
        res = self.rollout(self.base_policy(), r.split, r.limit, r.samples, r.temperature, "base rollouts")
        return {"outputs": {"trajectories": res["uri"]}, "jobs": [res["job"]], "result": res}

    def stage_analysis(self) -> dict[str, Any]:
        a = self.cfg.analysis
        uri = self.manifest.stages["rollout"].outputs["trajectories"]
        spec = A.AnalysisSpec(rollout_uris=[uri], num_runs=a.num_runs, min_passing_runs=a.min_passing_runs,
                              min_coverage=a.min_coverage, min_gap=a.min_gap, seed=self.cfg.seed,
                              mode=A.ANALYST_MODE_LLM if a.mode == "llm" else A.ANALYST_MODE_DIAGNOSTICS)
        if a.llm:
            spec.llm.CopyFrom(t.LlmEndpoint(base_url=a.llm.base_url, model=a.llm.model, api_key_env=a.llm.api_key_env))
        resp = self.runner.run("analysis", spec, self.cfg.run_id, "contrastive analysis")
        results = [MessageToDict(r, preserving_proto_field_name=True) for r in resp.results]
        retained = sorted((r for r in results if r.get("retained")), key=lambda r: -r.get("coverage_mean", 0.0))
        chosen = retained[: a.max_capabilities]
        if not chosen:
            raise StageFailed("analysis retained no capability: nothing to train. The report lists every "
                              "candidate with its coverage and gap; lower analysis.min_gap/min_coverage only "
                              "with a reason")
        return {"outputs": {o.kind: o.uri for o in resp.job.outputs}, "jobs": [resp.job.job_id],
                "result": {"candidates": results, "capabilities": [c["capability"] for c in chosen],
                           "mode": a.mode}}

    def stage_environments(self) -> dict[str, Any]:
        e = self.cfg.environments
        caps = self.manifest.stages["analysis"].result["capabilities"]
        spec = E.GenerationSpec(
            capabilities=[t.Capability(name=c["name"], description=c.get("description", ""),
                                       evidence=c.get("evidence", [])[:10],
                                       failed_task_ids=c.get("failed_task_ids", [])[:100]) for c in caps],
            target=self.target_ref(), max_retries=e.max_retries, seed=self.cfg.seed,
            mode=E.GENERATION_MODE_LLM if e.mode == "llm" else E.GENERATION_MODE_LIBRARY,
            calibration_policy=self.base_policy(), calibration_reward_min=e.calibration_reward_min,
            calibration_reward_max=e.calibration_reward_max)
        if e.llm:
            spec.llm.CopyFrom(t.LlmEndpoint(base_url=e.llm.base_url, model=e.llm.model, api_key_env=e.llm.api_key_env))
        if e.calibration_min_informative is not None:
            spec.calibration_min_informative = e.calibration_min_informative
        resp = self.runner.run("environment", spec, self.cfg.run_id, "environment synthesis")
        envs = [MessageToDict(r, preserving_proto_field_name=True) for r in resp.environments]
        accepted = [r for r in envs if r.get("status") == "VALIDATION_STATUS_ACCEPTED"]
        if not accepted:
            reasons = "; ".join(f"{r.get('capability')}: {r.get('rejection_reasons')}" for r in envs)
            raise StageFailed(f"no environment was accepted: {reasons}")
        return {"jobs": [resp.job.job_id], "outputs": {r["capability"]: r["code"]["uri"] for r in accepted},
                "result": {"environments": envs, "accepted": [r["capability"] for r in accepted]}}

    def train(self, kind: int, capability: str, envs: list[t.EnvironmentRef], config: dict[str, Any],
              label: str, adapter_uris: dict[str, str] | None = None):
        spec = T.TrainingSpec(kind=kind, capability=capability, environments=envs, policy=self.base_policy(),
                              config=_struct(config), adapter_uris=adapter_uris or {},
                              executor=T.EXECUTOR_KUBERNETES if self.cfg.training.executor == "kubernetes"
                              else T.EXECUTOR_LOCAL)
        # attach: a re-run whose old job still trains (deployed trainer) follows it instead of being refused
        return self.runner.run("trainer", spec, self.cfg.run_id, label, labels={"capability": capability}, attach=True)

    def stage_adapters(self) -> dict[str, Any]:
        envs = self.manifest.stages["environments"].result["environments"]
        accepted = [r for r in envs if r.get("status") == "VALIDATION_STATUS_ACCEPTED"]

        def one(rec: dict[str, Any]):
            ref = t.EnvironmentRef(name=rec["name"], version=rec.get("version", ""))
            return rec["capability"], self.train(T.TRAINING_KIND_ADAPTER, rec["capability"], [ref],
                                                 self.cfg.training.grpo, f"adapter {rec['capability']}")

        with ThreadPoolExecutor(self.cfg.training.parallel) as pool:
            done = list(pool.map(one, accepted))
        adapters, metrics, curves, jobs = {}, {}, {}, []
        for cap, resp in done:
            outs = {o.kind: o.uri for o in resp.job.outputs}
            adapters[cap] = outs["adapter"]
            if "training_metrics" in outs:
                curves[cap] = outs["training_metrics"]
            metrics[cap] = dict(resp.job.metrics)
            jobs.append(resp.job.job_id)
        return {"outputs": adapters, "jobs": jobs, "result": {"metrics": metrics, "curves": curves}}

    def stage_gates(self) -> dict[str, Any]:
        adapters = self.manifest.stages["adapters"].outputs
        envs = self.manifest.stages["environments"].result["environments"]
        refs = [t.EnvironmentRef(name=r["name"], version=r.get("version", ""))
                for r in sorted(envs, key=lambda r: r["capability"]) if r["capability"] in adapters]
        refs.append(self.target_ref(split="train"))
        resp = self.train(T.TRAINING_KIND_GATES, f"{self.cfg.run_id}-moe"[:64], refs, self.cfg.gates.config,
                          "gate training", adapter_uris=adapters)
        return {"outputs": {o.kind: o.uri for o in resp.job.outputs}, "jobs": [resp.job.job_id],
                "result": {"metrics": dict(resp.job.metrics)}}

    def stage_evaluation(self) -> dict[str, Any]:
        from tracectl.run.evaluation import evaluate

        return evaluate(self)

    def stage_report(self) -> dict[str, Any]:
        from tracectl.run.report import write_report

        return write_report(self.cfg, self.manifest, self.store)

    # -- driver -------------------------------------------------------------------------------
    def run(self, from_stage: str | None = None, until: str | None = None,
            on_stage: Callable[[str, str], None] | None = None) -> Manifest:
        m = self.manifest
        if from_stage:
            m.invalidate_from(from_stage)
        upstream: list[Any] = []
        stale = False
        for stage in STAGES:
            upstream.append(self.cfg.section(stage))
            want = config_hash(*upstream)
            rec = m.stages[stage]
            if not stale and rec.status == "completed" and rec.config_hash == want:
                console.print(f"[dim]stage {stage}: done earlier, reused[/]")
                if until == stage:
                    break
                continue
            if stale or rec.config_hash != want:
                rec.partial = {}  # units finished under another config or on other inputs are not reusable
            elif rec.partial:
                console.print(f"[dim]stage {stage}: {len(rec.partial)} unit(s) finished by an earlier attempt "
                              "are reused[/]")
            stale = True  # everything after a re-run stage is re-run too
            rec.status, rec.config_hash, rec.started_at, rec.error = "running", want, time.time(), ""
            m.save(self.store)
            console.rule(f"stage {stage}")
            try:
                out = getattr(self, f"stage_{stage}")()
            except Exception as err:
                rec.status, rec.error, rec.finished_at = "failed", str(err)[:2000], time.time()
                m.save(self.store)
                raise
            rec.outputs, rec.jobs, rec.result = out.get("outputs", {}), out.get("jobs", []), out.get("result", {})
            rec.partial = {}
            rec.status, rec.finished_at = "completed", time.time()
            m.save(self.store)
            if on_stage:
                on_stage(stage, "completed")
            if until == stage:
                break
        return m
