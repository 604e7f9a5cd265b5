"""The evaluation stage: every arm on the same held-out tasks, paired comparisons, budgets.

Arms (each a rollout job on `evaluation.split`, `evaluation.limit` tasks -- 0: the whole split --,
greedy unless configured otherwise; the same tasks for every arm):
  base               the base agent
  best_single        the capability adapter with the best pass rate on the *dev* split
                     (chosen without looking at the test split), evaluated on test
  grpo_target        GRPO directly on the target's training tasks at TRACE's total budget: the
                     1x point of the budget curve below
  gepa               the base agent with a system prompt optimised by the `gepa` package
                     (reflection LLM required; TRACE's total budget in episodes)
  trace_routing      base + adapters + gates, token-level top-1 routing
  trace_per_request  the same composition, one adapter per request (routing "per_request")
  trace_soft         the same gates applied softly per trajectory (routing "soft_trajectory",
                     the reference code's default; an ablation). A service without that mode
                     fails the arm, saying so: it is never skipped
Each arm also plays `probe_limit` tasks of the probe env (the target with `probe_params`:
single-capability tasks) for the per-probe breakdown; the compound tasks give the breakdown per
required capability (scoring.py).

Budget (budget.trace_budget): TRACE's budget B counts every episode TRACE played -- base
rollouts, calibration, adapter training, gate training -- with tokens beside them. The budget
curve is ONE GRPO run on the target's training tasks (the adapters' GRPO config, unguided: the
target supplies no hints) trained to the largest point, checkpointed at every point
(`curve_iterations`; the trainer's `checkpoint_at`), each checkpoint evaluated on the test split;
its x is the trainer's own rollouts_total at that iteration.

Paired statistics: TRACE routing against every other arm and every curve point, on the same
tasks (per-task outcomes): exact McNemar p and a paired bootstrap 95 % interval of the
difference (trace_common.stats), and the minimum detectable difference at this test size. With
`evaluation.trials` k > 1 (tau2's pass^k convention) every arm plays each test task k times and
the task is the unit: per-task success counts, a paired bootstrap over tasks, a sign-flip
permutation p over tasks, and the difference detectable at 80 % power from the observed spread of
per-task differences (`paired_min_detectable`).

Nothing trained (analysis.on_no_capability "baselines": the analysis retained no capability, or no
environment was accepted): the adapters and gates stages recorded why (`nothing_to_train`), B is
what TRACE did play (the rollout stage's episodes, and the calibration of rejected candidates),
and the arms that need adapters (`NEEDS_ADAPTERS`) are not played: `arms_not_played` records each
with the reason. Without trace_routing there is no paired comparison (`paired`).

Units (`Pipeline.unit`): every arm, its probe run, each dev rollout, the curve's training job and
each curve point is recorded in the manifest when it finishes, so a run killed in the middle of
the evaluation keeps what it finished, and a resumed evaluation builds the same tables (greedy
decoding; the same recorded outcomes). Arms run `evaluation.parallel` at a time; the tables are
assembled in `evaluation.arms` order whatever order they finish in.

Records: every arm, point and comparison is a typed record of tracectl/run/results.py, stored as
its JSON (`dump`) and read back through the model. The stage asks the pipeline only for what
`EvaluationHost` (host.py) states.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from trace_common.grpc.client import messages
from trace_common.stats import (
    mcnemar_min_detectable,
    paired_comparison,
    paired_min_detectable,
    paired_trials_comparison,
)
from tracectl.evaluation.budget import GatesCounts, GrpoCounts, trace_budget
from tracectl.evaluation.host import EvaluationHost
from tracectl.evaluation.scoring import (
    arm_summary,
    outcomes,
    read_trajectories,
    trajectory_tokens,
    trial_successes,
)
from tracectl.run.config import grpo_target_config
from tracectl.run.jobs import StageFailed
from tracectl.run.results import (
    ArmResult,
    CurvePoint,
    CurveRun,
    CurveTraining,
    DevRun,
    EvaluationResult,
    Paired,
    PairedComparison,
    Power,
    Probes,
    dump,
    results_of,
)

T = messages("trainer")

#: Composition arms -> PolicyRef.routing.
ROUTING = {"trace_routing": "token", "trace_per_request": "per_request", "trace_soft": "soft_trajectory"}
#: Arms that play TRACE's adapters (best_single) or its composition (the ROUTING arms).
NEEDS_ADAPTERS = ("best_single", *ROUTING)
#: The arm every other arm is compared with.
REFERENCE = "trace_routing"
#: Discordant-pair fractions the report states the minimum detectable difference for.
DISCORDANCE = (0.1, 0.2, 0.3)
ALPHA = 0.05
#: The power at which the minimum detectable difference of a several-trial evaluation is stated.
POWER = 0.8


def per_iteration(grpo: Mapping[str, Any]) -> int:
    """Episodes one GRPO iteration plays without resampling, from a config as the trainer parses it."""
    counts = GrpoCounts.model_validate(grpo)
    return counts.groups_per_batch * counts.num_generations


def curve_iterations(multiples: list[float], budget: int, grpo: Mapping[str, Any]) -> dict[float, int]:
    """The GRPO iteration of each budget point (`grpo`: the config as the trainer parses it).

    Semantics:
        per_iteration = groups_per_batch x num_generations          (nominal: resampled groups add more)
        it(m) = max(1, ceil(m x budget / per_iteration))            for each multiple m
    The trainer's rollouts_total at it(m) is the point's actual x (>= m x budget unless the run
    resamples less than nominal, which it never does)."""
    per = per_iteration(grpo)
    return {m: max(1, math.ceil(round(m * budget / per, 9))) for m in multiples}


def point_name(multiple: float) -> str:
    return "grpo_target" if multiple == 1.0 else f"grpo_target@{multiple:g}x"


def _checkpoint_adapter(uri: str) -> str:
    """A checkpoint's checkpoint.json URI -> the URI of its PEFT adapter beside it."""
    return uri.rsplit("/", 1)[0] + "/adapter_model.safetensors"


@dataclass
class Played:
    """What one item of `evaluation.arms` produced: its arms (curve points included) and jobs."""

    arms: dict[str, ArmResult]
    jobs: list[str]
    curve: list[CurvePoint] | None = None
    curve_training: CurveTraining | None = None


class Evaluation:
    """One evaluation stage run over a host `p` (module docstring; host.py)."""

    def __init__(self, p: EvaluationHost):
        self.p = p
        self.ev = p.cfg.evaluation
        m = p.manifest
        self.adapters: dict[str, str] = m.stages["adapters"].outputs
        self.gates_out: dict[str, str] = m.stages["gates"].outputs
        # the configs as the trainer parses them, asked only where a count needs them (trace_budget)
        grpo = functools.cache(lambda: GrpoCounts.model_validate(
            p.parsed_config(T.TRAINING_KIND_ADAPTER, "training.grpo", p.cfg.training.grpo)))
        gates = functools.cache(lambda: GatesCounts.model_validate(
            p.parsed_config(T.TRAINING_KIND_GATES, "gates.config", p.cfg.gates.config)))
        self.budget = trace_budget(p.store, m.stages, grpo, gates)
        self.B = self.budget.total_episodes
        self.probe_limit = self.ev.probes_for(p.cfg.target.env)
        results = results_of(m)
        why = {"best_single": results.adapters.nothing_to_train,
               **dict.fromkeys(ROUTING, results.gates.nothing_to_train)}
        #: arm -> why it is not played: it needs adapters, and the run trained none (module docstring)
        self.not_played = {arm: f"needs TRACE's adapters, and none were trained: {why[arm]}"
                           for arm in self.ev.arms if why.get(arm)}

    # -- one arm ------------------------------------------------------------------------------
    @staticmethod
    def spent(episodes: int, tokens: int | None, tokens_missing: list[str] | None = None, **parts: Any) -> dict[str, Any]:
        """An arm's method budget (ArmResult's fields): every episode it played before the test,
        tokens (prompt + completion) of the parts that report them, and the parts that do not."""
        return {"training_episodes": int(episodes), "training_tokens": None if tokens is None else int(tokens),
                "training_tokens_missing": list(tokens_missing or []), **parts}

    def trace_spent(self) -> dict[str, Any]:
        b = self.budget
        return self.spent(self.B, b.total_prompt_tokens + b.total_completion_tokens, b.tokens_missing)

    def play(self, name: str, policy, spent: dict[str, Any], *, extra: dict[str, Any] | None = None,
             system_prompt: str = "", probes: bool = True, train_seconds: float = 0.0) -> ArmResult:
        """The arm `name` on the test split (and its probes), each a unit; `train_seconds`: the training
        its wall time adds (the 1x GRPO point's)."""
        ev, p = self.ev, self.p

        def work() -> dict[str, Any]:
            started = time.time()
            res = p.rollout(policy, ev.split, ev.limit, ev.trials, ev.temperature, f"eval {name}",
                            system_prompt=system_prompt)
            return dump(ArmResult(**{**dump(res), **arm_summary(p.store, res.uri, ev.trials), **spent, **(extra or {}),
                                     "train_seconds": train_seconds,
                                     "wall_seconds_total": train_seconds + (time.time() - started)}))
        arm = ArmResult.model_validate(p.unit("evaluation", f"arm {name}", work))
        if probes and self.probe_limit:
            arm.probes = self.probe(name, policy, system_prompt)
        return arm

    def probe(self, name: str, policy, system_prompt: str = "") -> Probes:
        ev, p = self.ev, self.p

        def work() -> dict[str, Any]:
            res = p.rollout(policy, ev.split, self.probe_limit, 1, ev.temperature, f"probes {name}",
                            env_params=ev.probe_params, system_prompt=system_prompt)
            summary = arm_summary(p.store, res.uri)
            by_probe = summary.pop("breakdown")
            return dump(Probes(job=res.job, uri=res.uri, episodes=res.episodes, successes=res.successes,
                               pass_rate=res.pass_rate, ci=res.ci, by_probe=by_probe, **summary))
        return Probes.model_validate(p.unit("evaluation", f"probe {name}", work))

    @staticmethod
    def jobs_of(arm: ArmResult) -> list[str]:
        return [*(arm.jobs or [arm.job]), *([arm.probes.job] if arm.probes else [])]

    # -- the arms -----------------------------------------------------------------------------
    def base(self) -> Played:
        arm = self.play("base", self.p.base_policy(), self.spent(0, 0))
        return Played({"base": arm}, self.jobs_of(arm))

    def best_single(self) -> Played:
        """Each adapter on the dev split, the best one on test. Its budget: what it took to have the
        adapters (rollout, calibration, every adapter's training) plus the dev episodes choosing one."""
        p, ev = self.p, self.ev

        def dev_run(uri: str, label: str) -> dict[str, Any]:
            res = p.rollout(p.base_policy(adapter_uri=uri), "dev", ev.dev_limit, 1, ev.temperature, label)
            prompt, completion = trajectory_tokens(read_trajectories(p.store, res.uri))
            return dump(DevRun(**dump(res), tokens=None if prompt is None else prompt + (completion or 0)))

        dev = {cap: DevRun.model_validate(p.unit("evaluation", f"dev {cap}",
                                                 lambda uri=uri, cap=cap: dev_run(uri, f"dev {cap}")))
               for cap, uri in sorted(self.adapters.items())}
        rates = {cap: r.pass_rate for cap, r in dev.items()}
        best = max(sorted(rates), key=lambda c: rates[c])
        c = self.budget.components
        parts = ("rollout", "calibration", "adapters")
        dev_episodes = sum(r.episodes for r in dev.values())
        episodes = sum(c[k].episodes for k in parts) + dev_episodes
        tokens = sum((c[k].prompt_tokens or 0) + (c[k].completion_tokens or 0) for k in parts) + \
            sum(r.tokens or 0 for r in dev.values())
        missing = [k for k in parts if c[k].prompt_tokens is None] + \
            (["dev"] if any(r.tokens is None for r in dev.values()) else [])
        arm = self.play("best_single", p.base_policy(adapter_uri=self.adapters[best]),
                        self.spent(episodes, tokens, missing, dev_episodes=dev_episodes),
                        extra={"adapter": best, "dev_pass_rates": rates})
        return Played({"best_single": arm}, [*(r.job for r in dev.values()), *self.jobs_of(arm)])

    def train_curve(self) -> tuple[dict[float, int], CurveRun]:
        """The curve's one GRPO run (a unit): checkpoints at every point, the trainer's per-iteration
        totals, the final adapter. The points' iterations come from the config as the trainer parses it."""
        p = self.p
        cfg = grpo_target_config(p.cfg.training.grpo)
        parsed = p.parsed_config(T.TRAINING_KIND_ADAPTER, "training.grpo", cfg)
        points = curve_iterations(self.ev.grpo_budgets, self.B, parsed)
        cfg.update(max_steps=max(points.values()), checkpoint_at=sorted(set(points.values())),
                   max_completion_length=p.completion_cap())   # the run's one cap, as TRACE's stages

        def work() -> dict[str, Any]:
            started = time.time()
            resp = p.train(T.TRAINING_KIND_ADAPTER, "target_grpo", [p.target_ref()], cfg, "GRPO on target tasks")
            outs = {o.kind: o.uri for o in resp.job.outputs}
            listed = p.stub("trainer").ListCheckpoints(T.ListCheckpointsRequest(job_id=resp.job.job_id))
            history: dict[str, dict[str, float]] = {}
            if "training_metrics" in outs:
                for line in p.store.get_bytes(p.store.key_of(outs["training_metrics"])).decode().splitlines():
                    if line.strip():
                        row = json.loads(line)   # the trainer's per-iteration metrics (its names)
                        history[str(int(row["iteration"]))] = {
                            k: row[k] for k in ("rollouts_total", "prompt_tokens_total", "completion_tokens_total")
                            if row.get(k) is not None}
            return dump(CurveRun(job=resp.job.job_id, uri=outs["adapter"], train_seconds=time.time() - started,
                                 max_steps=cfg["max_steps"], checkpoint_at=cfg["checkpoint_at"],
                                 per_iteration=per_iteration(parsed), metrics=dict(resp.job.metrics),
                                 checkpoints={str(int(c.iteration)): _checkpoint_adapter(c.artifact.uri)
                                              for c in listed.checkpoints},
                                 history=history, iterations=max((int(k) for k in history), default=cfg["max_steps"])))
        return points, CurveRun.model_validate(p.unit("evaluation", "train grpo_target", work))

    def grpo_curve(self) -> Played:
        p = self.p
        points, trained = self.train_curve()
        curve, arms, jobs = [], {}, [trained.job]
        for multiple, it in sorted(points.items()):
            point = CurvePoint(multiple=multiple, iteration=it, name=point_name(multiple))
            adapter = trained.checkpoints.get(str(it))
            if adapter is None and it == trained.iterations:
                adapter = trained.uri
            if it > trained.iterations:
                point.skipped = (f"the GRPO run stopped early at iteration {trained.iterations} (no "
                                 "informative group for early_stop_uninformative_iterations), before this point")
            elif adapter is None:
                point.skipped = (f"no checkpoint at iteration {it}: the GRPO job resumed from checkpoints "
                                 "written before this point was asked for")
            if point.skipped:
                if multiple == 1.0:
                    raise StageFailed(f"grpo_target: {point.skipped}. Delete runs/{p.cfg.run_id}/adapters/"
                                      "target_grpo/ and re-run the evaluation (--from evaluation)")
                curve.append(point)
                continue
            totals = trained.history.get(str(it), {})
            episodes = totals.get("rollouts_total")
            point.estimated = episodes is None
            episodes = int(episodes) if episodes is not None else it * trained.per_iteration
            known = "prompt_tokens_total" in totals and "completion_tokens_total" in totals
            spent = self.spent(episodes, totals["prompt_tokens_total"] + totals["completion_tokens_total"]
                               if known else None, [] if known else ["grpo"])
            arm = self.play(point.name, p.base_policy(adapter_uri=adapter), spent,
                            extra={"adapter_uri": adapter, "iteration": it, "budget_multiple": multiple},
                            train_seconds=trained.train_seconds if multiple == 1.0 else 0.0, probes=multiple == 1.0)
            jobs += self.jobs_of(arm)
            point = point.model_copy(update={"pass_rate": arm.pass_rate, "ci": arm.ci, "episodes": arm.episodes,
                                             "successes": arm.successes, "training_episodes": arm.training_episodes,
                                             "training_tokens": arm.training_tokens})
            curve.append(point)
            arms[point.name] = arm
        training = CurveTraining(job=trained.job, max_steps=trained.max_steps, checkpoint_at=trained.checkpoint_at,
                                 per_iteration=trained.per_iteration, iterations=trained.iterations,
                                 train_seconds=trained.train_seconds)
        return Played(arms, jobs, curve=curve, curve_training=training)

    def composition(self, arm: str) -> Played:
        comp = self.gates_out.get("composition")
        if not comp:
            raise StageFailed("gate training produced no composition artifact; cannot evaluate TRACE")
        routing = ROUTING[arm]
        try:
            rec = self.play(arm, self.p.base_policy(composition_uri=comp, routing=routing), self.trace_spent())
        except Exception as err:
            if arm != "trace_soft":
                raise
            detail = err.details() if hasattr(err, "details") else str(err)
            raise StageFailed(f"arm trace_soft needs the composition routing mode 'soft_trajectory' (soft "
                              f"per-trajectory routing, the ablation arm); the services refused or failed it: "
                              f"{detail}. Update the rollout/inference services, or drop 'trace_soft' from "
                              "evaluation.arms") from err
        return Played({arm: rec}, self.jobs_of(rec))

    def gepa(self) -> Played:
        from tracectl.evaluation.gepa import run_gepa

        p = self.p
        recorded = ArmResult.model_validate(p.unit("evaluation", "arm gepa", lambda: run_gepa(p, budget=self.B)))
        # a read of what the unit recorded: the same on resume
        arm = ArmResult.model_validate({**dump(recorded), **arm_summary(p.store, recorded.uri, self.ev.trials),
                                        "training_tokens": None,
                                        "training_tokens_missing": ["gepa rollouts (not counted)"]})
        if self.probe_limit:
            arm.probes = self.probe("gepa", p.base_policy(), system_prompt=arm.prompt or "")
        return Played({"gepa": arm}, self.jobs_of(arm))

    def item(self, arm: str) -> Callable[[], Played]:
        if arm in ROUTING:
            return lambda: self.composition(arm)
        return {"base": self.base, "best_single": self.best_single, "grpo_target": self.grpo_curve,
                "gepa": self.gepa}[arm]

    # -- the stage -----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        ev = self.ev
        played = [arm for arm in ev.arms if arm not in self.not_played]
        if self.not_played:
            print(f"evaluation: not played: {', '.join(self.not_played)} (they need TRACE's adapters; none were "
                  f"trained); playing {', '.join(played) or 'nothing'} at TRACE's budget of {self.B} episodes",
                  flush=True)
        with ThreadPoolExecutor(max(1, min(ev.parallel, len(played)))) as pool:
            futures = [pool.submit(self.item(arm)) for arm in played]
            wait(futures)   # every arm runs to its end (and is recorded) even when another one failed
        for f in futures:
            if f.exception() is not None:
                raise f.exception()
        done: list[Played] = [f.result() for f in futures]
        arms = {name: rec for d in done for name, rec in d.arms.items() if not name.startswith("grpo_target@")}
        points = {name: rec for d in done for name, rec in d.arms.items() if name.startswith("grpo_target@")}
        result = EvaluationResult(arms=arms, budget=self.budget, trace_budget_episodes=self.B,
                                  grpo_curve=next((d.curve for d in done if d.curve is not None), []),
                                  grpo_curve_points=points,
                                  grpo_curve_training=next((d.curve_training for d in done if d.curve_training), None),
                                  arms_not_played=self.not_played)
        result.paired, result.power = self.paired({**arms, **points})
        if REFERENCE in arms and self.gates_out.get("composition"):
            from tracectl.run.routing import routing_usage

            ref = arms[REFERENCE]
            result.expert_usage, result.routed_example = routing_usage(
                self.p.stub("inference"), self.p.store, self.gates_out["composition"],
                ref.probes.uri if ref.probes else ref.uri, name=f"{self.p.cfg.run_id}-moe")
        return {"jobs": [j for d in done for j in d.jobs], "result": dump(result)}

    def paired(self, arms: dict[str, ArmResult]) -> tuple[Paired | None, Power | None]:
        """TRACE routing vs every other arm (and curve point) on the same tasks, and the test's power:
        exact McNemar at one trial per task, a sign-flip permutation over tasks at several."""
        if REFERENCE not in arms:
            return None, None
        ref = arms[REFERENCE]
        trials = ref.trials
        vs: dict[str, PairedComparison] = {}
        for name, arm in arms.items():
            if name == REFERENCE:
                continue
            if arm.task_ids_sha256 != ref.task_ids_sha256 or arm.trials != trials:
                raise StageFailed(f"arms {REFERENCE} and {name} played different tasks or trials ({ref.episodes} "
                                  f"vs {arm.episodes} episodes): a paired comparison needs the same tasks")
            if trials == 1:
                stats = paired_comparison(outcomes(ref), outcomes(arm), samples=self.ev.bootstrap_samples,
                                          seed=self.p.cfg.seed)
            else:
                stats = paired_trials_comparison(trial_successes(ref), trial_successes(arm), trials,
                                                 samples=self.ev.bootstrap_samples, seed=self.p.cfg.seed)
            vs[name] = PairedComparison.model_validate(stats)
        paired = Paired(reference=REFERENCE, vs=vs)
        n = len(ref.outcomes)
        if trials > 1:
            x = trial_successes(ref)
            sds = {k: statistics.pstdev([(a - b) / trials for a, b in zip(x, trial_successes(arms[k]), strict=True)])
                   for k in vs} if n else {}
            return paired, Power(n=n, alpha=ALPHA, trials=trials, power=POWER, observed_sd=sds,
                                 min_detectable_observed={k: paired_min_detectable(n, sd, ALPHA, POWER)
                                                          for k, sd in sds.items()})
        return paired, Power(n=n, alpha=ALPHA,
                             min_detectable={f"{q:g}": mcnemar_min_detectable(n, q, ALPHA) for q in DISCORDANCE}
                             if n else {},
                             observed_discordance={k: (v.only_x + v.only_y) / n for k, v in vs.items()} if n else {})


def evaluate(p: EvaluationHost) -> dict[str, Any]:
    return Evaluation(p).run()
