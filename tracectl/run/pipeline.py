"""The TRACE loop as resumable stages, each one service call (or a few in parallel).

    rollout      base agent on the target's training tasks            -> trajectories
    analysis     contrastive capability analysis                      -> retained capabilities
    environments one validated environment per retained capability   -> environment records
    adapters     one GRPO LoRA adapter per capability (parallel jobs) -> adapter URIs
    gates        gate-only training of the MoE over frozen adapters   -> composition
    evaluation   every arm on the same held-out tasks (and probes);   -> pass rates with CIs, paired
                 GRPO on the target at several budgets                   statistics, TRACE's budget
    report       markdown + self-contained HTML with plots            -> report files

Each stage reads what earlier stages recorded in the manifest, and records its own outputs
there (see manifest.py for the resume rule). Nothing here computes a model: all work is done
by the services through their gRPC APIs. `check`, run by `tracectl run` before the first stage
(and alone by `tracectl run --check`), has the trainer parse the GRPO configs of the run, so a
mistake there is reported before any work starts, as one anywhere else in the config is.

Nothing to train. An analysis that retains no capability, or an environments stage that accepts no
environment, fails its stage (analysis.on_no_capability "stop", the default). With "baselines" it
completes, and so do the later TRACE stages, each empty, saying so in one console line and
recording why (`nothing_to_train` of its result): no job is created, and the evaluation plays the
arms that need no adapter (tracectl/evaluation/stage.py).

One completion cap and every counted episode trained (issue 31). The rollout stage first fixes
the run's completion cap (completion_cap.py) and records it; every later policy episode uses it:
the base and evaluation rollouts (`rollout`), calibration (`calibration_sampling`, with the
adapters' sampling temperature, top_p and top_k as the trainer parses training.grpo), the adapters'
and gates' training (max_completion_length). Each adapter job also gets its environment's
calibration batches (`initial_batches_uri`, from the validation report), so the calibration
episodes of an accepted level are its first GRPO batches instead of being thrown away.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Struct
from rich.console import Console

from trace_common.artifacts import ArtifactStore
from trace_common.errors import InvalidArgument
from trace_common.grpc.client import messages
from trace_common.proto.trace.v1 import types_pb2 as t
from trace_common.suggest import closest
from tracectl.run.completion_cap import derive as derive_completion_cap
from tracectl.run.config import RunConfig, grpo_target_config
from tracectl.run.jobs import JobFailed, JobRunner, StageFailed
from tracectl.run.manifest import STAGES, Manifest, config_hash
from tracectl.run.results import (
    AdaptersResult,
    AnalysisResult,
    Candidate,
    CompletionCap,
    EnvironmentRecord,
    EnvironmentsResult,
    GatesResult,
    Rollout,
    RolloutStageResult,
    StageOutcome,
    UnexplainedFailures,
    dump,
    results_of,
)

console = Console(stderr=True)
R, A, E, T = (messages(s) for s in ("rollout", "analysis", "environment", "trainer"))


#: What follows when the analysis (or the environments stage) finds nothing to train, under
#: analysis.on_no_capability "baselines".
AFTER_NO_CAPABILITY = ("environments, adapters and gates have nothing to train; the evaluation plays only the arms "
                       "that need no adapter")
AFTER_NO_ENVIRONMENT = "adapters and gates have nothing to train; the evaluation plays only the arms that need no adapter"


def say_nothing_to_train(line: str) -> None:
    """`line` on the console as one line (never wrapped): a stage completing with nothing under
    analysis.on_no_capability 'baselines', so a rehearsal's log says why later stages did no work."""
    console.print(f"{line} (analysis.on_no_capability: baselines)", soft_wrap=True, markup=False, highlight=False)


def config_struct(name: str, config: dict[str, Any]) -> t.Config:
    """`config` as a proto Config, or InvalidArgument naming `name` when a value has no JSON form
    (a YAML date or timestamp, a set...)."""
    try:
        return _struct(config)
    except (TypeError, ValueError) as err:
        raise InvalidArgument(field=name, expected="JSON-like values (numbers, strings, booleans, lists, "
                              "mappings)", reason=str(err), fix="quote the value in the YAML file") from None


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
    #: Serialises `unit` bookkeeping: the evaluation runs its arms on several threads.
    _units_lock: threading.Lock = dataclass_field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    # -- shared pieces ---------------------------------------------------------------------
    def target_ref(self, **params: str) -> t.EnvironmentRef:
        tg = self.cfg.target
        uri = tg.uri if (not tg.uri or tg.uri.startswith(("file://", "s3://"))) else f"file://{tg.uri}"
        return t.EnvironmentRef(name=tg.env, uri=uri, params={**tg.params, **params})

    # Endpoints go out as base URLs only, never a key variable: the service maps a URL to one of its
    # endpoint profiles (tracectl's own for embedded services: tracectl/run/endpoints.py; the
    # operator's TRACE_<SERVICE>_ENDPOINTS for deployed ones), whose key applies.
    def base_policy(self, **kw: str) -> t.PolicyRef:
        b = self.cfg.base_agent
        backend = t.POLICY_BACKEND_OPENAI_HTTP if b.backend == "http" else t.POLICY_BACKEND_IN_PROCESS
        return t.PolicyRef(backend=backend, model=b.name, endpoint=b.endpoint, **kw)

    def base_agent_identity(self) -> dict[str, Any]:
        """What the rollout stage's reuse check adds to its config section: the key of the agent the
        base-agent name resolves to now (`base_agent_key`), so a rebuilt `micro` (new key) re-runs
        the rollout stage and everything after it instead of reusing the old agent's episodes. Computed
        with this checkout's code: right for the embedded services; a deployed service resolves the
        name with its own image's code. An HTTP base agent is known by its name and endpoint only."""
        b = self.cfg.base_agent
        if b.backend == "http":
            return {"base_agent_key": None}
        from trace_common.agents.resolve import base_agent_key  # imports torch: only when a run starts

        return {"base_agent_key": base_agent_key(b.name)}

    def user_simulator(self) -> t.LlmEndpoint | None:
        u = self.cfg.target.user_simulator
        return t.LlmEndpoint(base_url=u.base_url, model=u.model) if u else None

    def completion_cap(self) -> int:
        """The run's one completion cap, as the rollout stage fixed it (completion_cap.py): recorded in its
        result once the stage completed, in its units while it runs."""
        rec = self.manifest.stages["rollout"]
        if "completion cap" in rec.partial:   # the stage is (re-)running: its own unit, not an earlier result
            cap = CompletionCap.model_validate(rec.partial["completion cap"])
        else:
            cap = RolloutStageResult.model_validate(rec.result).max_completion_length
        if cap is None or not cap.tokens:
            raise StageFailed("the rollout stage recorded no completion cap (max_completion_length): the run "
                              "predates it; re-run from the rollout stage (tracectl run --from rollout)")
        return cap.tokens

    def trained_config(self) -> dict[str, Any]:
        """The adapters' GRPO config as the trainer parses it (its defaults filled in)."""
        return self.parsed_config(T.TRAINING_KIND_ADAPTER, "training.grpo", self.cfg.training.grpo)

    def trained_sampling(self) -> dict[str, Any]:
        """temperature, top_p and top_k of the adapters' GRPO config as the trainer parses it (its
        defaults filled in): calibration samples with them, so its episodes can be training batches."""
        parsed = self.trained_config()
        return {"temperature": float(parsed["temperature"]), "top_p": float(parsed["top_p"]),
                "top_k": int(parsed["top_k"])}

    def rollout(self, policy: t.PolicyRef, split: str, limit: int, samples: int, temperature: float,
                label: str, seed: int = 0, *, env_params: dict[str, str] | None = None,
                system_prompt: str = "", max_tokens: int | None = None, task_ids: list[str] | None = None,
                labels: dict[str, str] | None = None) -> Rollout:
        """One rollout job on the target (`env_params` added to its params: the probe env is the target
        with task_types=probes); `system_prompt` replaces the environment's own (the GEPA arm's);
        `task_ids` instead of split/limit when given (GEPA's minibatches); `max_tokens`: the run's
        completion cap unless given (0: the service's default); `labels` added to the job's."""
        cap = self.completion_cap() if max_tokens is None else max_tokens
        tasks = R.TaskSelection(task_ids=task_ids) if task_ids is not None else R.TaskSelection(split=split, limit=limit)
        spec = R.RolloutSpec(environment=self.target_ref(**(env_params or {})), policy=policy,
                             tasks=tasks, samples_per_task=samples,
                             sampling=t.SamplingParams(temperature=temperature, seed=seed, max_tokens=cap),
                             concurrency=self.cfg.rollout.concurrency, seed=seed + self.cfg.seed,
                             system_prompt=system_prompt)
        if self.cfg.target.user_simulator:
            spec.user_simulator.CopyFrom(self.user_simulator())
        resp = self.runner.run("rollout", spec, self.cfg.run_id, label, labels={"stage": label[:60], **(labels or {})})
        s = resp.summary
        return Rollout(job=resp.job.job_id, uri=next(o.uri for o in resp.job.outputs if o.kind == "trajectories"),
                       episodes=s.episodes, successes=s.successes, pass_rate=s.pass_rate,
                       ci=[s.pass_rate_ci_low, s.pass_rate_ci_high], reward_mean=s.reward_mean,
                       wall_seconds=(resp.job.end_time.ToNanoseconds() - resp.job.start_time.ToNanoseconds()) / 1e9)

    def stub(self, service: str) -> Any:
        """A gRPC stub of `service` on the run's connection."""
        return self.runner.conn.stub(service)

    def parsed_config(self, kind: int, field: str, config: dict[str, Any]) -> dict[str, Any]:
        """`config` (the run config's `field`) as the trainer parses it: every default filled in. A
        trainer that refuses it: InvalidArgument naming the field; one without the RPC: StageFailed
        (tracectl re-types none of the trainer's defaults, so it cannot count without it)."""
        request = T.ValidateTrainingConfigRequest(kind=kind, field_path=field, config=config_struct(field, config))
        try:
            return MessageToDict(self.stub("trainer").ValidateTrainingConfig(request).config.values)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise InvalidArgument(err.details() or f"{field}: refused by the trainer") from None
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise StageFailed(f"{field}: this trainer cannot parse configs (no ValidateTrainingConfig), which the "
                                  "run needs to count episodes with the trainer's own defaults; update the trainer "
                                  "service to this version") from None
            raise

    def unit(self, stage: str, key: str, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """`work()` once per stage attempt chain: its result is recorded in the manifest as soon as it
        returns, and a re-run of the stage after a kill or failure (same config) reuses it instead of
        running it again (manifest.py: `partial`). The result must be JSON-serialisable. Safe to call
        from several threads at once (distinct keys): the record and the manifest save are locked,
        `work()` is not."""
        rec = self.manifest.stages[stage]
        with self._units_lock:
            if key in rec.partial:
                console.print(f"[dim]{stage}: {key} done earlier, reused[/]")
                return rec.partial[key]
        out = work()
        with self._units_lock:
            rec.partial[key] = out
            self.manifest.save(self.store)
        return out

    # -- stages ------------------------------------------------------------------------------
    def stage_rollout(self) -> dict[str, Any]:
        r = self.cfg.rollout
        cap = CompletionCap.model_validate(self.unit("rollout", "completion cap",
                                                     lambda: dump(derive_completion_cap(self))))
        res = self.rollout(self.base_policy(), r.split, r.limit, r.samples, r.temperature, "base rollouts")
        jobs = [*([cap.expert_job] if cap.expert_job else []), res.job]
        return {"outputs": {"trajectories": res.uri}, "jobs": jobs,
                "result": dump(RolloutStageResult(**dump(res), max_completion_length=cap))}

    def stage_analysis(self) -> dict[str, Any]:
        a = self.cfg.analysis
        uri = self.manifest.stages["rollout"].outputs["trajectories"]
        spec = A.AnalysisSpec(rollout_uris=[uri], num_runs=a.num_runs, min_passing_runs=a.min_passing_runs,
                              min_coverage=a.min_coverage, min_gap=a.min_gap, seed=self.cfg.seed,
                              mode=A.ANALYST_MODE_LLM if a.mode == "llm" else A.ANALYST_MODE_DIAGNOSTICS)
        if a.llm:
            spec.llm.CopyFrom(t.LlmEndpoint(base_url=a.llm.base_url, model=a.llm.model))
        try:
            resp = self.runner.run("analysis", spec, self.cfg.run_id, "contrastive analysis")
        except JobFailed as err:
            # the analyst's replies were unusable (FAILED_PRECONDITION: the model does not follow the reply
            # format, e.g. a 135M model in `tracectl rehearse`): no capability, said so, when asked to go on
            if a.on_no_capability == "stop" or err.code != "FAILED_PRECONDITION":
                raise
            why = f"the analyst produced no usable capability ({err})"
            say_nothing_to_train(f"analysis: {why}: {AFTER_NO_CAPABILITY}")
            return {"outputs": {}, "jobs": [err.job_id],
                    "result": dump(AnalysisResult(candidates=[], capabilities=[], mode=a.mode, nothing_to_train=why))}
        results = [Candidate.model_validate(MessageToDict(r, preserving_proto_field_name=True)) for r in resp.results]
        unexplained = (UnexplainedFailures.model_validate(MessageToDict(
            resp.unexplained_failures, preserving_proto_field_name=True, always_print_fields_with_no_presence=True))
            if resp.HasField("unexplained_failures") else None)
        retained = sorted((r for r in results if r.retained), key=lambda r: -r.coverage_mean)
        chosen = retained[: a.max_capabilities]
        why = None
        if not chosen:
            if a.on_no_capability == "stop":
                raise StageFailed("analysis retained no capability: nothing to train. The report lists every "
                                  "candidate with its coverage and gap; lower analysis.min_gap/min_coverage only "
                                  "with a reason, or set analysis.on_no_capability: baselines to evaluate the "
                                  "baselines anyway")
            why = f"the analysis retained no capability (of {len(results)} candidate(s))"
            say_nothing_to_train(f"analysis: retained no capability (of {len(results)} candidate(s)): "
                                 f"{AFTER_NO_CAPABILITY}")
        return {"outputs": {o.kind: o.uri for o in resp.job.outputs}, "jobs": [resp.job.job_id],
                "result": dump(AnalysisResult(candidates=results, capabilities=[c.capability for c in chosen],
                                              mode=a.mode, nothing_to_train=why,
                                              unexplained_failures=unexplained))}

    def stage_environments(self) -> dict[str, Any]:
        e = self.cfg.environments
        analysis = results_of(self.manifest).analysis
        if analysis.nothing_to_train:
            say_nothing_to_train(f"environments: nothing to generate: {analysis.nothing_to_train}")
            return {"result": dump(EnvironmentsResult(nothing_to_train=analysis.nothing_to_train))}
        caps = analysis.capabilities
        spec = E.GenerationSpec(
            capabilities=[t.Capability(name=c.name, description=c.description, evidence=c.evidence[:10],
                                       failed_task_ids=c.failed_task_ids[:100]) for c in caps],
            target=self.target_ref(), max_retries=e.max_retries, seed=self.cfg.seed,
            mode=E.GENERATION_MODE_LLM if e.mode == "llm" else E.GENERATION_MODE_LIBRARY,
            calibration_policy=self.base_policy(), calibration_reward_min=e.calibration_reward_min,
            calibration_reward_max=e.calibration_reward_max)
        if e.llm:
            spec.llm.CopyFrom(t.LlmEndpoint(base_url=e.llm.base_url, model=e.llm.model))
        if e.calibration_min_informative is not None:
            spec.calibration_min_informative = e.calibration_min_informative
        # sampled as the adapters' first GRPO iteration samples: their episodes become its batches
        spec.calibration_sampling.CopyFrom(t.SamplingParams(max_tokens=self.completion_cap(),
                                                            **self.trained_sampling()))
        resp = self.runner.run("environment", spec, self.cfg.run_id, "environment synthesis")
        envs = [EnvironmentRecord.model_validate(MessageToDict(r, preserving_proto_field_name=True))
                for r in resp.environments]
        accepted = [r for r in envs if r.accepted]
        if not accepted:
            reasons = "; ".join(f"{r.capability}: {r.rejection_reasons}" for r in envs)
            if self.cfg.analysis.on_no_capability == "stop":
                raise StageFailed(f"no environment was accepted: {reasons}")
            why = f"no environment was accepted ({reasons})"
            say_nothing_to_train(f"environments: {why}: {AFTER_NO_ENVIRONMENT}")
            return {"jobs": [resp.job.job_id],
                    "result": dump(EnvironmentsResult(environments=envs, nothing_to_train=why))}
        return {"jobs": [resp.job.job_id], "outputs": {r.capability: r.code.uri if r.code else "" for r in accepted},
                "result": dump(EnvironmentsResult(environments=envs, accepted=[r.capability for r in accepted]))}

    def executor(self) -> int:
        """The Executor the run's training jobs are created with (training.executor)."""
        return T.EXECUTOR_KUBERNETES if self.cfg.training.executor == "kubernetes" else T.EXECUTOR_LOCAL

    def train(self, kind: int, capability: str, envs: list[t.EnvironmentRef], config: dict[str, Any],
              label: str, adapter_uris: dict[str, str] | None = None):
        spec = T.TrainingSpec(kind=kind, capability=capability, environments=envs, policy=self.base_policy(),
                              config=_struct(config), adapter_uris=adapter_uris or {}, executor=self.executor())
        # attach: a re-run whose old job still trains (deployed trainer) follows it instead of being refused
        return self.runner.run("trainer", spec, self.cfg.run_id, label, labels={"capability": capability}, attach=True)

    def stage_adapters(self) -> dict[str, Any]:
        environments = results_of(self.manifest).environments
        if environments.nothing_to_train:
            say_nothing_to_train(f"adapters: nothing to train: {environments.nothing_to_train}")
            return {"result": dump(AdaptersResult(nothing_to_train=environments.nothing_to_train))}
        envs = environments.environments
        accepted = [r for r in envs if r.accepted]

        batches = {rec.capability: self.initial_batches(rec) for rec in accepted}
        grpo = self.trained_config() if any(batches.values()) else {}
        manifests = {cap: self.batches_manifest(b) for cap, b in batches.items() if b}
        raised = {cap: n for cap, m in manifests.items()
                  if (n := self.initial_iterations(m, grpo)) > int(grpo["max_steps"])}
        for cap, n in raised.items():
            print(f"adapters: {cap}: its calibration episodes fill {n} iterations, more than training.grpo.max_steps "
                  f"{int(grpo['max_steps'])}: max_steps raised to {n} for it, so every counted episode trains", flush=True)

        def one(rec: EnvironmentRecord):
            ref = t.EnvironmentRef(name=rec.name, version=rec.version)
            config = {**self.cfg.training.grpo, "max_completion_length": self.completion_cap(),
                      **batches[rec.capability]}
            if rec.capability in raised:
                config["max_steps"] = raised[rec.capability]
            if rec.capability in manifests and not config.get("max_turns"):
                # the turn budget its calibration played (the environment's own default, which the trainer's
                # remote view of the environment does not know), so its batches are the job's own samples
                config["max_turns"] = manifests[rec.capability].max_turns
            return rec.capability, self.train(T.TRAINING_KIND_ADAPTER, rec.capability, [ref], config,
                                              f"adapter {rec.capability}")

        with ThreadPoolExecutor(self.cfg.training.parallel) as pool:
            done = list(pool.map(one, accepted))
        adapters, metrics, curves, tensorboard, jobs = {}, {}, {}, {}, []
        for cap, resp in done:
            outs = {o.kind: o.uri for o in resp.job.outputs}
            adapters[cap] = outs["adapter"]
            if "training_metrics" in outs:
                curves[cap] = outs["training_metrics"]
            if "tensorboard" in outs:   # the job's newest event file; its directory is the logdir
                tensorboard[cap] = outs["tensorboard"]
            metrics[cap] = dict(resp.job.metrics)
            jobs.append(resp.job.job_id)
        return {"outputs": adapters, "jobs": jobs, "result": dump(AdaptersResult(
            metrics=metrics, curves=curves, tensorboard=tensorboard,
            initial_batches={cap: b.get("initial_batches_uri", "") for cap, b in batches.items()},
            max_steps_raised=raised))}

    def batches_manifest(self, batches: dict[str, str]) -> Any:
        """The calibration-batches manifest `batches` names (only the manifest, not its episodes)."""
        import json

        from trace_common.env.calibration_batches import CalibrationBatches

        uri = batches["initial_batches_uri"]
        return CalibrationBatches.model_validate(json.loads(self.store.get_bytes(self.store.key_of(uri))))

    @staticmethod
    def initial_iterations(manifest: Any, grpo: dict[str, Any]) -> int:
        """Iterations a calibration-batches manifest fills under the parsed GRPO config `grpo`
        (initial_batches.py: ceil(groups / groups_per_batch), groups = seeds x (group_size // num_generations))."""
        import math

        groups = len(manifest.seeds) * (manifest.group_size // int(grpo["num_generations"]))
        return math.ceil(groups / int(grpo["groups_per_batch"]))

    def initial_batches(self, rec: EnvironmentRecord) -> dict[str, str]:
        """{"initial_batches_uri": ...} for an accepted environment whose validation report names its
        calibration batches (trace_common/env/calibration_batches.py) with token ids on every turn,
        else {}: a scripted stand-in calibrated it (no batches), or a backend that returned no token ids
        (nothing GRPO could score); those calibration episodes stay counted, untrained."""
        import json

        report_uri = rec.validation_report.uri if rec.validation_report else ""
        if not report_uri:
            return {}
        report = json.loads(self.store.get_bytes(self.store.key_of(report_uri)))
        batches = report.get("calibration_batches") or {}
        return {"initial_batches_uri": batches["uri"]} if batches.get("uri") and batches.get("token_ids") else {}

    def stage_gates(self) -> dict[str, Any]:
        """Gate training over the frozen adapters: each capability's environment (the provenance warm
        start's episodes for its slot), the target with split=train (GRPO on the gates and the outcome
        warm start's replays play only its training tasks), and the base agent's own trajectories of
        the rollout stage (the target's training tasks: slot 0's provenance, `base_provenance_uris`,
        read only with warm_start_labels: provenance)."""
        results = results_of(self.manifest)
        if results.adapters.nothing_to_train:
            say_nothing_to_train(f"gates: nothing to train: {results.adapters.nothing_to_train}")
            return {"result": dump(GatesResult(nothing_to_train=results.adapters.nothing_to_train))}
        resp, labels = self.train_gates(f"{self.cfg.run_id}-moe"[:64], self.cfg.gates.config, "gate training")
        return {"outputs": {o.kind: o.uri for o in resp.job.outputs}, "jobs": [resp.job.job_id],
                "result": dump(GatesResult(metrics=dict(resp.job.metrics), warm_start_labels=labels))}

    def train_gates(self, name: str, gates_config: dict[str, Any], label: str) -> tuple[Any, str]:
        """(the job's response, its warm-start label kind): one gate-training job named `name` over the
        run's adapters with `gates_config` (the gates stage's own: cfg.gates.config; a dev experiment
        may pass another under another name), the run's completion cap added."""
        adapters = self.manifest.stages["adapters"].outputs
        envs = results_of(self.manifest).environments.environments
        refs = [t.EnvironmentRef(name=r.name, version=r.version)
                for r in sorted(envs, key=lambda r: r.capability) if r.capability in adapters]
        refs.append(self.target_ref(split="train"))
        config = {**gates_config, "max_completion_length": self.completion_cap()}
        labels = str(self.parsed_config(T.TRAINING_KIND_GATES, "gates.config", gates_config)["warm_start_labels"])
        if labels == "provenance":
            config["base_provenance_uris"] = [self.manifest.stages["rollout"].outputs["trajectories"]]
        return self.train(T.TRAINING_KIND_GATES, name, refs, config, label, adapter_uris=adapters), labels

    def stage_evaluation(self) -> dict[str, Any]:
        from tracectl.evaluation.stage import evaluate

        return evaluate(self)

    def stage_report(self) -> dict[str, Any]:
        from tracectl.run.report import write_report

        return write_report(self.cfg, self.manifest, self.store)

    # -- start-up check -------------------------------------------------------------------------
    def trainer_configs(self) -> list[tuple[str, str, int, dict[str, Any]]]:
        """(what it is, its field in the run config, TrainingKind, config) of every config this run's
        training jobs get: the adapters' `training.grpo`, the grpo_target arm's variant of it
        (tracectl/evaluation/stage.py trains that arm unguided; its max_steps follows TRACE's budget, known only
        after the gates stage) and `gates.config`."""
        grpo = self.cfg.training.grpo
        out = [("training.grpo", "training.grpo", T.TRAINING_KIND_ADAPTER, grpo)]
        if "grpo_target" in self.cfg.evaluation.arms:
            out.append(("training.grpo as the grpo_target arm trains it (unguided)", "training.grpo",
                        T.TRAINING_KIND_ADAPTER, grpo_target_config(grpo)))
        out.append(("gates.config", "gates.config", T.TRAINING_KIND_GATES, self.cfg.gates.config))
        return out

    def check(self) -> list[str]:
        """Every part of the run config that only a service can parse, checked before the first stage;
        nothing is created (no job, no manifest). The GRPO configs go to the trainer's
        ValidateTrainingConfig, which parses them with its own models; the target environment and
        its splits are looked up in the rollout service's list (`_check_target`); a tau2 target's
        data directory is looked up here when the rollout service runs embedded (same machine,
        same files). Raises InvalidArgument naming the field; returns the names of what was checked.
        A deployed trainer that predates the RPC (UNIMPLEMENTED) checks its configs when their
        jobs are created: said once on the console. The gates stage (which warm-start labels the
        trainer will use) and any budget estimate need the parsed configs, and stop there saying so.

        The trainer asked is told the run's executor when it is the one that will run the jobs (the
        deployed trainer the connection addresses, or the embedded one of a run that deploys none):
        it then checks vLLM rollouts against its own settings as it will check the jobs (endpoint
        profile, adapter root, the Job template's mounts). A stand-in -- the embedded trainer asked
        about a config that deploys one (--check's offline pass) -- has not the deployment's
        settings, so it parses the fields only; --check asks the deployed trainer itself when it is
        reachable."""
        checked = self._check_tau2_data() + self._check_target()
        stub = self.runner.conn.stub("trainer")
        trains = self.runner.conn.deployed("trainer") or "trainer" not in self.cfg.services
        executor = self.executor() if trains else T.EXECUTOR_UNSPECIFIED
        for label, field, kind, config in self.trainer_configs():
            request = T.ValidateTrainingConfigRequest(kind=kind, config=config_struct(field, config), field_path=field,
                                                      executor=executor)
            try:
                stub.ValidateTrainingConfig(request)
            except grpc.RpcError as err:
                if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    prefix = "" if label == field else f"{label}: "
                    raise InvalidArgument(prefix + (err.details() or "refused by the trainer")) from None
                if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                    console.print("[yellow]this trainer cannot check configs ahead (no ValidateTrainingConfig): "
                                  "training.grpo and gates.config are checked when their jobs start[/]")
                    return checked
                raise
            checked.append(label)
        return checked

    def _check_target(self) -> list[str]:
        """target.env is one the rollout service plays; with no params and no data directory given
        (the service's own instance of it), rollout.split and evaluation.split are among its splits."""
        tg = self.cfg.target
        try:
            listed = self.runner.conn.stub("rollout").ListRolloutEnvironments(R.ListRolloutEnvironmentsRequest())
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                return []
            raise
        envs = {e.name: e for e in listed.environments}
        if tg.env not in envs:
            raise InvalidArgument(field="target.env", expected=f"an environment the rollout service plays "
                                  f"({', '.join(sorted(envs))})", got=tg.env,
                                  fix=f"Did you mean {near!r}?" if (near := closest(tg.env, envs)) else None)
        sizes = dict(envs[tg.env].split_sizes)
        if not sizes or tg.params or tg.uri:
            return ["target.env"]
        for field, split in (("rollout.split", self.cfg.rollout.split), ("evaluation.split", self.cfg.evaluation.split)):
            if split not in sizes:
                raise InvalidArgument(field=field, expected=f"a split of {tg.env} ({', '.join(sorted(sizes))})",
                                      got=split, fix=f"Did you mean {near!r}?" if (near := closest(split, sizes))
                                      else None)
        return ["target.env", "rollout.split", "evaluation.split"]

    def _check_tau2_data(self) -> list[str]:
        tg = self.cfg.target
        if not tg.env.startswith("tau2-") or "rollout" in self.cfg.services:
            return []   # a deployed rollout service reads its own files: its job reports what is missing
        from trace_common.domains.tau2.data import DATA_ENV_VAR, resolve_domain_dir
        from trace_common.errors import NotFound

        data = tg.params.get("data") or tg.uri.removeprefix("file://") or None   # as the rollout service reads it
        try:
            resolve_domain_dir(data, tg.env.removeprefix("tau2-"))
        except NotFound as err:
            looked = (str(err).split("; ")[0]).removeprefix("no tau2 tasks.json under ")
            raise InvalidArgument(field="target.uri", expected="a tau2 data directory (holding tasks.json, or "
                                  f"a {tg.env.removeprefix('tau2-')}/ folder with it)",
                                  got=tg.uri or f"${DATA_ENV_VAR} / the default ({looked})",
                                  fix=f"set target.uri in the run config, or ${DATA_ENV_VAR}, to tau2-bench's "
                                      "data/tau2/domains directory or one domain inside it") from None
        return ["target.uri"]

    # -- driver -------------------------------------------------------------------------------
    def run(self, from_stage: str | None = None, until: str | None = None,
            on_stage: Callable[[str, str], None] | None = None) -> Manifest:
        m = self.manifest
        if from_stage:
            m.invalidate_from(from_stage)
        upstream: list[Any] = []
        legacy: list[Any] = []   # as runs recorded before the scheduling fields left the hashes (config.py)
        stale = False
        for stage in STAGES:
            upstream.append(self.cfg.section(stage))
            legacy.append(self.cfg.section(stage, legacy=True))
            if stage == "rollout":
                upstream.append(self.base_agent_identity())
                legacy.append(upstream[-1])
            want = config_hash(*upstream)
            rec = m.stages[stage]
            if not stale and rec.config_hash == config_hash(*legacy) != want:
                rec.config_hash = want   # the same configuration, recorded under the earlier hash
            if not stale and rec.status == "completed" and rec.config_hash == want:
                console.print(f"[dim]stage {stage}: done earlier, reused[/]")
                if until == stage:
                    break
                continue
            if not stale and rec.status == "completed":
                console.print(f"[yellow]stage {stage}: its configuration (or an earlier stage's) changed since it "
                              "completed: re-running it and every stage after it[/]")
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
                outcome = StageOutcome.model_validate(getattr(self, f"stage_{stage}")())
            except Exception as err:
                rec.status, rec.error, rec.finished_at = "failed", str(err)[:2000], time.time()
                m.save(self.store)
                raise
            rec.outputs, rec.jobs, rec.result = outcome.outputs, outcome.jobs, outcome.result
            rec.partial = {}
            rec.status, rec.finished_at = "completed", time.time()
            m.save(self.store)
            if on_stage:
                on_stage(stage, "completed")
            if until == stage:
                break
        return m
