"""`tracectl run --config F --plan`: what a run will play and what it will cost, before it runs.

GPU hours are spent by episodes, so the plan counts them the way the run report does
(tracectl/evaluation: budget.trace_budget; stage.py), from the config alone: no job is created, nothing is
played, no manifest is written. What only a service knows without work is asked the way `--check`
asks it: the GRPO configs as the trainer parses them (its defaults filled in, never re-typed here:
ValidateTrainingConfig) and the target's split sizes (the rollout service's listing).

Why two counts per row. Some counts are fixed by the config (the base rollouts, every evaluation
arm's test and probe tasks); the others depend on what the run finds: how many capabilities the
analysis retains and how many environments are accepted (1 to K for a run that finishes, K =
analysis.max_capabilities; 0 to K with analysis.on_no_capability "baselines"), how many calibration levels or LLM attempts an environment takes,
whether groups are re-collected (`max_resample_rounds`), an early stop, and TRACE's own budget B for
the GRPO curve. Each row gives its nominal count and an upper bound (`worst`), and names what makes
it vary; a row that names nothing is deterministic: every finished run of the config plays exactly
its count.

Semantics (K = analysis.max_capabilities; sizes: the target's split sizes; tasks(limit, split) =
min(limit or size, size); GRPO fields are those of the configs as the trainer parses them):
    completion cap   EXPERT_TASKS scripted expert episodes when the cap is derived (completion_cap.py);
                     no model plays them, no budget counts them
    rollout          tasks(rollout.limit, rollout.split) x rollout.samples
    calibration      per capability, attempts x groups x group_size; attempts nominal 1, worst:
                     library mode LIBRARY_MAX_LEVELS, llm mode 1 + max_retries (0: the service's
                     default); groups, group_size: TRACE_ENVIRONMENT_VALIDATION_GROUPS / _GROUP_SIZE
                     where the environment service is embedded (it reads this process's environment),
                     else the service's defaults
    adapters         per adapter (B = groups_per_batch, G = num_generations, R = max_resample_rounds):
                     c = groups x (group_size // G) calibration groups it trains on first (in-process
                     base agent: its calibration recorded token ids), n0 = ceil(c / B) (Pipeline.
                     initial_iterations), steps = max(max_steps, n0) (the pipeline raises max_steps)
                     nominal = (steps - n0) x B x G
                     worst   = (steps - n0) x B x G x (1 + R) + R x c x G   (every group re-collected)
    gates            warm start: budget.warm_start_episodes(gates, K)
                     GRPO: max_steps x B x G, worst x (1 + R)       (the parsed gates.config's)
    B                sum over rollout, calibration, adapters, gates (nominal; worst)
    evaluation       every arm: tasks(limit, split) x trials test + tasks(probe_limit, split) probes;
                     best_single also K x tasks(dev_limit, dev); grpo_target: one GRPO run to
                     it(max multiple) iterations (evaluation.curve_iterations over B; its config is
                     grpo_target_config's, parsed), x per_iteration, worst x (1 + R) at B worst, and
                     every curve point's test tasks (probes at 1x only); gepa: at most B episodes
                     optimising the prompt
    tokens           episodes x turns x (prompt tokens per turn, completion tokens per turn): the
                     target's measured turn lengths (MEASURED_TURNS, or TRACE_PLAN_* settings)
    GPU-hours        (prompt + completion tokens) / throughput / 3600; rollout throughput for rollout
                     jobs and calibration, training throughput for training jobs (adapters, gates, the
                     GRPO curve), the adapters' updates on their calibration episodes included

Not counted, as the report does not count them: the validation's scripted checks (oracle, no-op,
random policies: no model), the analysis and GEPA's reflection (LLM calls, no episodes), the
routing-trace figure. GPU-hours are token time only: loading models, starting jobs and writing
checkpoints are not in them (on the quick run behind the defaults the gates job took 163 s where its
tokens price at 22 s).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import grpc
from pydantic import BaseModel, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from trace_common.errors import FailedPrecondition, InvalidArgument
from tracectl.evaluation.budget import GatesCounts, warm_start_episodes
from tracectl.evaluation.stage import curve_iterations, per_iteration, point_name
from tracectl.run.completion_cap import EXPERT_TARGETS, EXPERT_TASKS
from tracectl.run.config import RunConfig, grpo_target_config

# -- what tracectl may not import from the environment service, stated here ------------------------
# tracectl imports no service (tests/unit/test_import_rules.py), so the environment service's own
# numbers are stated here; tests/unit/run/test_plan.py checks each against the service's code.
#: The most calibration levels a library family has (services/environment/library: ServiceEnv.levels
#: is (3, 2, 1); two families have (3, 2)): the worst case of attempts per capability in library mode.
LIBRARY_MAX_LEVELS = 3
#: EnvironmentSettings.validation_groups / validation_group_size / default_max_retries defaults, and
#: the variables that set them (the service reads its environment; embedded, that is this process's).
CALIBRATION_SETTINGS = {"groups": ("TRACE_ENVIRONMENT_VALIDATION_GROUPS", 16),
                        "group_size": ("TRACE_ENVIRONMENT_VALIDATION_GROUP_SIZE", 8),
                        "default_max_retries": ("TRACE_ENVIRONMENT_DEFAULT_MAX_RETRIES", 3)}

# -- measured figures (defaults) -------------------------------------------------------------------
#: Per-GPU throughput defaults, in tokens (prompt + completion, as the trainer and evaluation/budget.py count
#: them: every assistant turn's full prompt and its completion) per second. Measured, not on a GPU:
#: examples/quick.yaml run to completion on this repository's 2-core CPU machine (2026-12-03, niced,
#: beside a `make demo` run: a loaded machine), micro base agent, embedded services; its manifest is
#: tests/fixtures/plan/quick-manifest.json. Rollout: the rollout stage's 538,881 tokens over its 520 s
#: of wall time; training: the grpo_target curve job's 3,947,323 tokens over its 664 s (31 iterations,
#: playing and updating). On such a machine a "GPU" is the whole machine: set
#: TRACE_PLAN_ROLLOUT_TOKENS_PER_GPU_S and TRACE_PLAN_TRAINING_TOKENS_PER_GPU_S to an accelerator's figures.
ROLLOUT_TOKENS_PER_GPU_S = 1036.0
TRAINING_TOKENS_PER_GPU_S = 5946.0
THROUGHPUT_SOURCE = ("measured on examples/quick.yaml's finished run on a 2-core CPU machine (micro, embedded "
                     "services; tests/fixtures/plan/quick-manifest.json), not a GPU")


@dataclass(frozen=True)
class TurnProfile:
    """A target's turn lengths in the base agent's tokens: assistant turns per episode, and per turn
    its full prompt and its completion (as the trainer counts them)."""

    turns: float
    prompt_tokens: float
    completion_tokens: float
    source: str


#: Measured turn lengths by (target env, base agent name): the rollout stage's trajectories of a
#: finished run (T = 1, as calibration and training sample), token ids per turn as the agent recorded them.
MEASURED_TURNS: dict[tuple[str, str], TurnProfile] = {
    # examples/quick.yaml's run of 2026-12-03 (tests/fixtures/plan/quick-manifest.json): 64 episodes of the
    # store's training tasks, 361 assistant turns, 524,507 prompt and 14,374 completion tokens
    ("store", "micro"): TurnProfile(turns=361 / 64, prompt_tokens=524_507 / 361, completion_tokens=14_374 / 361,
                                    source="micro's 64 rollout-stage episodes of examples/quick.yaml's run "
                                           "(2026-12-03; tests/fixtures/plan/quick-manifest.json)"),
}


class PlanSettings(BaseSettings):
    """The plan's throughput figures and turn lengths (TRACE_PLAN_<FIELD>)."""

    model_config = SettingsConfigDict(env_prefix="TRACE_PLAN_", extra="ignore")

    rollout_tokens_per_gpu_s: float = Field(ROLLOUT_TOKENS_PER_GPU_S, gt=0, description="Tokens (prompt + "
                                            "completion) one GPU plays per second in rollout jobs and calibration.")
    training_tokens_per_gpu_s: float = Field(TRAINING_TOKENS_PER_GPU_S, gt=0, description="Tokens of played "
                                             "episodes one GPU plays and trains on per second in a GRPO job.")
    turns_per_episode: float | None = Field(None, gt=0, description="Assistant turns per episode (replaces the "
                                            "measured value).")
    prompt_tokens_per_turn: float | None = Field(None, gt=0, description="Prompt tokens of one assistant turn "
                                                 "(its full prompt).")
    completion_tokens_per_turn: float | None = Field(None, gt=0, description="Completion tokens of one "
                                                     "assistant turn.")


def plan_settings(environ: Mapping[str, str] | None = None) -> PlanSettings:
    """The settings from `environ` (default: this process's), or InvalidArgument naming the variable."""
    try:
        if environ is None:
            return PlanSettings()
        names = {f"TRACE_PLAN_{name.upper()}": name for name in PlanSettings.model_fields}
        return PlanSettings.model_validate({names[k]: v for k, v in environ.items() if k in names})
    except ValidationError as err:
        first = err.errors()[0]
        var = f"TRACE_PLAN_{str(first['loc'][0]).upper()}" if first.get("loc") else "TRACE_PLAN_*"
        raise InvalidArgument(field=var, expected="a positive number", got=first.get("input"),
                              reason=first["msg"], fix=f"unset it for the default or give e.g. {var}=2500") from None


# -- what only a service knows, asked without work ------------------------------------------------
@dataclass(frozen=True)
class Facts:
    """What the plan needs besides the run config: the trainer's parsed GRPO configs (defaults
    filled in), the target's split sizes (empty: unknown), and the calibration settings in force."""

    grpo: dict[str, Any]
    grpo_target: dict[str, Any]
    gates: dict[str, Any]
    split_sizes: dict[str, int]
    calibration: dict[str, int]
    calibration_source: str


def calibration_settings(cfg: RunConfig, environ: Mapping[str, str]) -> tuple[dict[str, int], str]:
    """groups, group_size and default_max_retries of the environment service, and where they come
    from: this process's variables when the service is embedded (it reads them), its defaults when
    it is deployed (its own settings are not visible here)."""
    embedded = "environment" not in cfg.services
    out, named = {}, []
    for key, (var, default) in CALIBRATION_SETTINGS.items():
        raw = environ.get(var) if embedded else None
        if raw is None:
            out[key] = default
            continue
        try:
            out[key] = int(raw)
        except ValueError:
            raise InvalidArgument(field=var, expected="an integer", got=raw,
                                  fix="the embedded environment service reads it too; unset it or fix it") from None
        if out[key] < (0 if key == "default_max_retries" else 1):
            raise InvalidArgument(field=var, expected="a positive integer", got=raw)
        named.append(f"{var}={raw}")
    if not embedded:
        return out, "the environment service's defaults (it is deployed: its own settings are not visible here)"
    return out, ("this process's " + ", ".join(named) + " (the embedded environment service reads them)" if named
                 else "the environment service's defaults (none of their variables is set here)")


def gather_facts(pipe, environ: Mapping[str, str] | None = None) -> Facts:
    """The Facts of the run `pipe` (a Pipeline whose `check()` passed): validation RPCs and the
    rollout service's environment listing only, as `--check` makes; no job. The embedded trainer's
    answer is the one a deployed trainer of this version gives."""
    from google.protobuf.json_format import MessageToDict

    from tracectl.run.pipeline import R, T, config_struct

    cfg = pipe.cfg
    stub = pipe.runner.conn.stub("trainer")

    def parsed(kind: int, field: str, config: dict[str, Any]) -> dict[str, Any]:
        request = T.ValidateTrainingConfigRequest(kind=kind, field_path=field, config=config_struct(field, config))
        try:
            return MessageToDict(stub.ValidateTrainingConfig(request).config.values)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            raise FailedPrecondition("this trainer cannot parse configs ahead (no ValidateTrainingConfig), and the "
                                     "plan counts with the trainer's defaults: update the trainer service") from None

    try:
        listed = pipe.runner.conn.stub("rollout").ListRolloutEnvironments(R.ListRolloutEnvironmentsRequest())
        sizes = next((dict(e.split_sizes) for e in listed.environments if e.name == cfg.target.env), {})
    except grpc.RpcError as err:   # an older rollout service lists nothing: sizes unknown (tasks() says so)
        if err.code() != grpc.StatusCode.UNIMPLEMENTED:
            raise
        sizes = {}
    calibration, source = calibration_settings(cfg, os.environ if environ is None else environ)
    return Facts(grpo=parsed(T.TRAINING_KIND_ADAPTER, "training.grpo", cfg.training.grpo),
                 grpo_target=parsed(T.TRAINING_KIND_ADAPTER, "training.grpo", grpo_target_config(cfg.training.grpo)),
                 gates=parsed(T.TRAINING_KIND_GATES, "gates.config", cfg.gates.config),
                 split_sizes={k: int(v) for k, v in sizes.items()}, calibration=calibration,
                 calibration_source=source)


# -- the plan ----------------------------------------------------------------------------------------
Kind = Literal["scripted", "rollout", "training"]


class Row(BaseModel):
    """Episodes one component of the run plays, with tokens and GPU-hours."""

    name: str = Field(description="The component: a stage's part (rollout, calibration, ...) or an arm's "
                      "('base: test', 'grpo_target: training', ...).")
    kind: Kind = Field(description="Which throughput prices it: scripted (no model), rollout or training.")
    episodes: int = Field(description="Nominal episodes (module docstring).")
    worst: int = Field(description="Upper bound of the episodes any run of the config plays here.")
    varies: list[str] = Field(default_factory=list, description="What makes a run's count differ from `episodes`; "
                              "empty: deterministic (every finished run plays exactly `episodes`).")
    in_budget: bool = Field(False, description="Counted in TRACE's budget B (evaluation/budget.py trace_budget).")
    prompt_tokens: int | None = Field(None, description="Estimated prompt tokens of the nominal episodes.")
    completion_tokens: int | None = Field(None, description="Estimated completion tokens of the nominal episodes.")
    gpu_hours: float | None = Field(None, description="Estimated GPU-hours of the nominal episodes.")
    gpu_hours_worst: float | None = Field(None, description="Estimated GPU-hours of the worst case.")
    note: str = ""

    @property
    def deterministic(self) -> bool:
        return not self.varies


class CurvePoint(BaseModel):
    """GRPO on the target at one multiple of TRACE's budget (evaluation.curve_iterations)."""

    multiple: float
    name: str
    iterations: int = Field(description="it(m) at B nominal.")
    iterations_worst: int = Field(description="it(m) at B worst.")
    episodes: int = Field(description="Training episodes to it(m), nominal (no re-collection).")
    worst: int = Field(description="Training episodes to it(m) at B worst, every group re-collected.")
    gpu_hours: float | None = None
    gpu_hours_worst: float | None = None


class Assumption(BaseModel):
    name: str
    value: str
    source: str


class Plan(BaseModel):
    """The plan of one run config (module docstring)."""

    run_id: str
    capabilities_max: int = Field(description="K: the most capabilities the run trains (analysis.max_capabilities).")
    stages: list[Row] = Field(description="What the stages before the evaluation play; in_budget rows make up B.")
    budget: int = Field(description="TRACE's budget B, nominal.")
    budget_worst: int = Field(description="TRACE's budget B, upper bound.")
    arms: list[Row] = Field(description="What each evaluation arm plays (test, probes, dev, training).")
    curve: list[CurvePoint] = Field(description="GRPO on the target at each evaluation.grpo_budgets multiple.")
    trace_gpu_hours: float | None = Field(None, description="GPU-hours of TRACE's budget, nominal.")
    trace_gpu_hours_worst: float | None = None
    assumptions: list[Assumption] = Field(default_factory=list, description="Every figure the plan took from "
                                          "outside the config, with where it comes from.")

    def row(self, name: str) -> Row:
        return next(r for r in [*self.stages, *self.arms] if r.name == name)


def tasks(limit: int, split: str, sizes: Mapping[str, int], field: str, split_field: str | None = None) -> int:
    """Tasks one rollout job plays: `limit` (0: the whole split), at most the split's size. A split
    the target does not have (its sizes listed, this one not among them) would fail its job: refused
    here, naming `split_field` (default `field`)."""
    if sizes and split not in sizes:
        raise InvalidArgument(field=split_field or field, expected=f"tasks of a split the target has ({', '.join(sorted(sizes))})",
                              reason=f"the run would play split {split!r}, which the target does not have",
                              fix="change the split, or drop the arm that plays it")
    size = sizes.get(split)
    if limit == 0:
        if size is None:
            raise InvalidArgument(field=field, expected=f"a limit for the plan: 0 means the whole {split!r} split, "
                                  "whose size the rollout service does not list for this target",
                                  fix=f"set {field} to the number of tasks to play")
        return size
    return limit if size is None else min(limit, size)


def turn_profile(cfg: RunConfig, settings: PlanSettings) -> TurnProfile | None:
    """The measured turn lengths of the run's target and base agent, TRACE_PLAN_* replacing any of
    them; None when neither gives all three."""
    measured = MEASURED_TURNS.get((cfg.target.env, cfg.base_agent.name))
    given = {"turns": settings.turns_per_episode, "prompt_tokens": settings.prompt_tokens_per_turn,
             "completion_tokens": settings.completion_tokens_per_turn}
    if measured is None and any(v is None for v in given.values()):
        return None
    base = measured or TurnProfile(0, 0, 0, "")
    values = {k: v if v is not None else getattr(base, k) for k, v in given.items()}
    set_here = [k for k, v in given.items() if v is not None]
    source = base.source if not set_here else ("TRACE_PLAN_* settings" + (f" ({', '.join(set_here)}); the rest: "
                                                                          f"{base.source}" if measured else ""))
    return TurnProfile(**values, source=source)


@dataclass(frozen=True)
class _Pricing:
    profile: TurnProfile | None
    settings: PlanSettings

    def tokens(self, episodes: int, kind: Kind = "rollout") -> tuple[int | None, int | None]:
        p = self.profile
        if p is None or kind == "scripted":   # a scripted policy generates no model tokens
            return None, None
        return round(episodes * p.turns * p.prompt_tokens), round(episodes * p.turns * p.completion_tokens)

    def hours(self, kind: Kind, episodes: int) -> float | None:
        if kind == "scripted":
            return 0.0
        prompt, completion = self.tokens(episodes)
        if prompt is None or completion is None:
            return None
        rate = self.settings.rollout_tokens_per_gpu_s if kind == "rollout" else self.settings.training_tokens_per_gpu_s
        return (prompt + completion) / rate / 3600.0

    def row(self, name: str, kind: Kind, episodes: int, worst: int, varies: list[str], *, in_budget: bool = False,
            extra_trained: int = 0, note: str = "") -> Row:
        prompt, completion = self.tokens(episodes, kind)
        hours, hours_worst = self.hours(kind, episodes + extra_trained), self.hours(kind, worst + extra_trained)
        return Row(name=name, kind=kind, episodes=episodes, worst=max(worst, episodes), varies=varies,
                   in_budget=in_budget, prompt_tokens=prompt, completion_tokens=completion, gpu_hours=hours,
                   gpu_hours_worst=hours_worst, note=note)


def _adapter(grpo: Mapping[str, Any], groups: int, group_size: int, batches: bool) -> tuple[int, int, int, int]:
    """(nominal, worst, calibration episodes trained on, iterations) of one adapter job (module docstring)."""
    b, g, r = int(grpo["groups_per_batch"]), int(grpo["num_generations"]), int(grpo["max_resample_rounds"])
    c = groups * (group_size // g) if batches and group_size % g == 0 else 0
    n0 = math.ceil(c / b)
    steps = max(int(grpo["max_steps"]), n0)
    played = (steps - n0) * b * g
    return played, played * (1 + r) + r * c * g, c * g, steps


def make_plan(cfg: RunConfig, facts: Facts, settings: PlanSettings) -> Plan:
    """The plan of `cfg` (module docstring): pure over the config, the facts and the settings."""
    price = _Pricing(turn_profile(cfg, settings), settings)
    sizes, k = facts.split_sizes, cfg.analysis.max_capabilities
    fewest = 0 if cfg.analysis.on_no_capability == "baselines" else 1   # "baselines" finishes with none trained
    over_k = [f"capabilities trained ({fewest} to {k})"] if k > fewest else []
    stages: list[Row] = []

    # -- before the evaluation --------------------------------------------------------------------
    if cfg.max_completion_length is None and cfg.target.env in EXPERT_TARGETS:
        n = tasks(EXPERT_TASKS, "train", sizes, "max_completion_length")
        stages.append(price.row("completion cap", "scripted", n, n, [],
                                note="the scripted expert's turns fix the one cap; no budget counts them"))
    r = cfg.rollout
    n = tasks(r.limit, r.split, sizes, "rollout.limit", "rollout.split") * r.samples
    stages.append(price.row("rollout", "rollout", n, n, [], in_budget=True))

    cal = facts.calibration
    per_attempt = cal["groups"] * cal["group_size"]
    e = cfg.environments
    if e.mode == "library":
        attempts, why = LIBRARY_MAX_LEVELS, f"library levels tried (1 to {LIBRARY_MAX_LEVELS}), rejected levels stop early"
    else:
        retries = e.max_retries or cal["default_max_retries"]
        attempts, why = 1 + retries, f"LLM attempts (1 to {1 + retries}), a rejected one may stop early"
    stages.append(price.row("calibration", "rollout", k * per_attempt, k * attempts * per_attempt, [*over_k, why],
                            in_budget=True, note=f"{cal['groups']} groups x {cal['group_size']} per attempt"))

    grpo = facts.grpo
    batches = cfg.base_agent.backend == "in-process"
    played, worst, trained, steps = _adapter(grpo, cal["groups"], cal["group_size"], batches)
    if not batches:   # an HTTP backend's calibration may have recorded no token ids: no batches, more played
        worst = max(worst, _adapter(grpo, cal["groups"], cal["group_size"], False)[1])
    varies = [*over_k]
    if int(grpo["max_resample_rounds"]):
        varies.append(f"re-collection rounds (up to {int(grpo['max_resample_rounds'])})")
    stop = int(grpo["early_stop_uninformative_iterations"])   # it can cut only iterations after the stop-th
    if stop and played and steps > stop:
        varies.append(f"early stop after {int(grpo['early_stop_uninformative_iterations'])} uninformative "
                      "iterations")
    if not batches:
        varies.append("calibration batches (an HTTP backend may record no token ids)")
    stages.append(price.row("adapters", "training", k * played, k * worst, varies, in_budget=True,
                            extra_trained=k * trained,
                            note=f"each trains first on its {trained} calibration episodes (counted under "
                                 "calibration)" if trained else ""))

    gates = facts.gates
    counts = GatesCounts.model_validate(gates)
    warm = warm_start_episodes(counts, k)
    labels = counts.warm_start_labels
    stages.append(price.row("gates: warm start", "training", warm, warm, over_k if warm else [], in_budget=True,
                            note=f"{labels} labels"))
    gb = int(gates["max_steps"]) * int(gates["groups_per_batch"]) * int(gates["num_generations"])
    gr = int(gates["max_resample_rounds"])
    varies = [f"re-collection rounds (up to {gr})"] if gr and gb else []
    if gb and 0 < int(gates["early_stop_uninformative_iterations"]) < int(gates["max_steps"]):
        varies.append(f"early stop after {int(gates['early_stop_uninformative_iterations'])} uninformative "
                      "iterations")
    stages.append(price.row("gates: GRPO", "training", gb, gb * (1 + gr), varies, in_budget=True))

    counted = [s for s in stages if s.in_budget]
    budget, budget_worst = sum(s.episodes for s in counted), sum(s.worst for s in counted)

    # -- the evaluation ---------------------------------------------------------------------------
    ev = cfg.evaluation
    test = tasks(ev.limit, ev.split, sizes, "evaluation.limit", "evaluation.split")
    probes = tasks(ev.probes_for(cfg.target.env), ev.split, sizes, "evaluation.probe_limit") \
        if ev.probes_for(cfg.target.env) else 0
    arms: list[Row] = []

    def played_on_test(arm: str, with_probes: bool = True) -> None:   # evaluation.trials each; probes one
        arms.append(price.row(f"{arm}: test", "rollout", test * ev.trials, test * ev.trials, [],
                              note=f"{test} tasks x {ev.trials} trials" if ev.trials > 1 else ""))
        if probes and with_probes:
            arms.append(price.row(f"{arm}: probes", "rollout", probes, probes, []))

    target_cfg = facts.grpo_target
    per, tr = per_iteration(target_cfg), int(target_cfg["max_resample_rounds"])
    its = curve_iterations(ev.grpo_budgets, budget, target_cfg)
    its_worst = curve_iterations(ev.grpo_budgets, budget_worst, target_cfg)
    curve = [CurvePoint(multiple=m, name=point_name(m), iterations=its[m], iterations_worst=its_worst[m],
                        episodes=its[m] * per, worst=its_worst[m] * per * (1 + tr),
                        gpu_hours=price.hours("training", its[m] * per),
                        gpu_hours_worst=price.hours("training", its_worst[m] * per * (1 + tr)))
             for m in ev.grpo_budgets]
    for arm in ev.arms:
        if arm == "best_single":
            dev = tasks(ev.dev_limit, "dev", sizes, "evaluation.arms: best_single (it chooses its adapter on "
                        "the dev split), evaluation.dev_limit")
            arms.append(price.row("best_single: dev", "rollout", k * dev, k * dev, over_k,
                                  note=f"{dev} dev tasks per adapter"))
            played_on_test(arm)
        elif arm == "grpo_target":
            last = curve[-1]
            varies = ["TRACE's budget B"] + ([f"re-collection rounds (up to {tr})"] if tr else [])
            arms.append(price.row("grpo_target: training", "training", last.episodes, last.worst, varies,
                                  note=f"one GRPO run to iteration {last.iterations} (B worst: "
                                       f"{last.iterations_worst}), {per} episodes per iteration"))
            for point in curve:
                played_on_test(point.name, with_probes=point.multiple == 1.0)
        elif arm == "gepa":
            arms.append(price.row("gepa: optimisation", "rollout", budget, budget_worst, ["TRACE's budget B"],
                                  note="at most B episodes (evaluation/gepa.py)"))
            played_on_test(arm)
        else:
            played_on_test(arm)

    hours = [s.gpu_hours for s in counted]
    hours_worst = [s.gpu_hours_worst for s in counted]
    return Plan(run_id=cfg.run_id, capabilities_max=k, stages=stages, budget=budget, budget_worst=budget_worst,
                arms=arms, curve=curve,
                trace_gpu_hours=None if None in hours else sum(hours),  # type: ignore[arg-type]
                trace_gpu_hours_worst=None if None in hours_worst else sum(hours_worst),  # type: ignore[arg-type]
                assumptions=assumptions(cfg, facts, settings, price.profile))


def assumptions(cfg: RunConfig, facts: Facts, settings: PlanSettings, profile: TurnProfile | None) -> list[Assumption]:
    """Every figure taken from outside the config, with its source (printed above the tables)."""
    cal = facts.calibration
    out = [Assumption(name="K (capabilities trained, at most)", value=str(cfg.analysis.max_capabilities),
                      source="analysis.max_capabilities"),
           Assumption(name="calibration per attempt", value=f"{cal['groups']} groups x {cal['group_size']} samples",
                      source=facts.calibration_source)]
    if cfg.environments.mode == "library":
        out.append(Assumption(name="calibration levels per capability, at most", value=str(LIBRARY_MAX_LEVELS),
                              source="the environment library's families (services/environment/library; checked by "
                                     "tests/unit/run/test_plan.py)"))
    out.append(Assumption(name="split sizes", value=", ".join(f"{k} {v}" for k, v in sorted(facts.split_sizes.items()))
                          or "unknown", source=f"the rollout service's listing of {cfg.target.env}"))
    out.append(Assumption(name="GRPO configs", value="training.grpo, its grpo_target variant, gates.config",
                          source="as the trainer parses them (ValidateTrainingConfig: its defaults filled in)"))
    defaults = PlanSettings.model_fields
    for field, what in (("rollout_tokens_per_gpu_s", "rollout throughput"),
                        ("training_tokens_per_gpu_s", "training throughput")):
        value = getattr(settings, field)
        source = THROUGHPUT_SOURCE if value == defaults[field].default else f"TRACE_PLAN_{field.upper()}"
        out.append(Assumption(name=f"{what} (tokens/s per GPU)", value=f"{value:,.0f}", source=source))
    if profile is None:
        out.append(Assumption(name="turn lengths", value="unknown: no tokens or GPU-hours",
                              source=f"no measured turn lengths for target {cfg.target.env!r} with base agent "
                                     f"{cfg.base_agent.name!r}; set TRACE_PLAN_TURNS_PER_EPISODE, "
                                     "TRACE_PLAN_PROMPT_TOKENS_PER_TURN and TRACE_PLAN_COMPLETION_TOKENS_PER_TURN"))
    else:
        out.append(Assumption(name="turn lengths", value=f"{profile.turns:.1f} turns x ({profile.prompt_tokens:,.0f} "
                              f"prompt + {profile.completion_tokens:,.0f} completion tokens)", source=profile.source))
    return out


# -- rendering -------------------------------------------------------------------------------------------
def _n(v: int | None) -> str:
    return "—" if v is None else f"{v:,}"


def _h(v: float | None) -> str:
    return "—" if v is None else f"{v:,.2f}"


def render(plan: Plan, config: object, file=None) -> None:
    """The plan as tables on stdout (or `file`)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=file or sys.stdout, soft_wrap=False, width=160 if file is not None or not sys.stdout.isatty()
                      else None)
    console.print(f"[bold]Plan of run {plan.run_id}[/] ({config}): episodes as the run report counts them; "
                  "nothing was run")
    facts = Table(title="Assumptions", show_lines=False)
    for col in ("figure", "value", "from"):
        facts.add_column(col)
    for a in plan.assumptions:
        facts.add_row(a.name, a.value, a.source)
    console.print(facts)

    def rows_table(title: str, rows: list[Row]) -> Table:
        table = Table(title=title)
        for col, right in (("component", False), ("episodes", True), ("worst case", True), ("varies with", False),
                           ("prompt tokens", True), ("completion tokens", True), ("GPU-h", True),
                           ("GPU-h worst", True)):
            table.add_column(col, justify="right" if right else "left")
        for r in rows:
            table.add_row(r.name + ("" if not r.note else f" [dim]({r.note})[/]"), _n(r.episodes), _n(r.worst),
                          "; ".join(r.varies) or "deterministic", _n(r.prompt_tokens), _n(r.completion_tokens),
                          _h(r.gpu_hours), _h(r.gpu_hours_worst))
        return table

    console.print(rows_table("Stages (rows marked B make up TRACE's budget)",
                             [r.model_copy(update={"name": r.name + (" [B]" if r.in_budget else "")})
                              for r in plan.stages]))
    console.print(f"TRACE's budget B: [bold]{plan.budget:,}[/] episodes (worst case {plan.budget_worst:,}), "
                  f"{_h(plan.trace_gpu_hours)} GPU-h (worst {_h(plan.trace_gpu_hours_worst)})")
    console.print(rows_table("Evaluation arms", plan.arms))
    curve = Table(title="TRACE vs GRPO on the target at each budget multiple (evaluation.grpo_budgets)")
    for col in ("multiple", "GRPO iterations", "GRPO episodes", "GRPO worst", "GRPO GPU-h", "GRPO GPU-h worst",
                "TRACE episodes (B)", "TRACE GPU-h", "TRACE GPU-h worst"):
        curve.add_column(col, justify="right")
    for p in plan.curve:
        curve.add_row(f"{p.multiple:g}x", f"{p.iterations} (worst {p.iterations_worst})", _n(p.episodes),
                      _n(p.worst), _h(p.gpu_hours), _h(p.gpu_hours_worst),
                      f"{plan.budget:,} (worst {plan.budget_worst:,})", _h(plan.trace_gpu_hours),
                      _h(plan.trace_gpu_hours_worst))
    console.print(curve)


def plan_command(cfg: RunConfig, endpoints, *, data_dirs: list[str], config: object) -> Plan:
    """`tracectl run --plan`: the offline checks of `--check` (Pipeline.check through services embedded
    in this process, whatever the config deploys, over a scratch store: the run's store, manifest and
    deployment are never touched), then the facts, the plan, printed. Raises InvalidArgument naming
    the field or variable."""
    from tracectl.run.preflight import check_pipeline

    settings = plan_settings()
    with check_pipeline(cfg, {}, None, endpoints, data_dirs if not cfg.services else []) as pipe:
        pipe.check()
        facts = gather_facts(pipe)
    plan = make_plan(cfg, facts, settings)
    render(plan, config)
    return plan
