"""The `tracectl run` configuration file (YAML), validated once here.

Every section maps onto one stage and one service. The GRPO configs (`training.grpo`,
`gates.config`) stay mappings here, because their models belong to the trainer and tracectl
does not import it: `Pipeline.check` sends them to the trainer's ValidateTrainingConfig before
the first stage, so a typo there fails the run before any work, as a typo anywhere else does
here (`load_config`: every wrong field named by its dotted path, with the closest valid name).

One completion cap. Every policy episode of a run -- base rollouts, calibration, adapter and gate
training, every evaluation arm -- caps an assistant turn at the same number of tokens, so the
episodes calibration measures are the ones training samples (issue 31). (The report's routing-trace
figure, which plays no episode, renders at most 64 tokens per request: routing.py.) `tracectl run` derives it
from the target (completion_cap.py); the top-level `max_completion_length` overrides it, once, with
a reason. A per-stage value (`max_completion_length` in training.grpo or gates.config) is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trace_common.config import SERVICE_NAMES
from trace_common.errors import InvalidArgument
from trace_common.suggest import did_you_mean, error_lines
from tracectl.inputs import read_yaml_mapping

Arm = Literal["base", "best_single", "grpo_target", "gepa", "trace_routing", "trace_per_request", "trace_soft"]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LlmSection(Section):
    base_url: str = Field(description="OpenAI-compatible endpoint, e.g. http://vllm:8000/v1. Requests carry only "
                          "this URL: a deployed service must have it in an endpoint profile (TRACE_<SERVICE>_ENDPOINTS); "
                          "for embedded services tracectl makes the profile (tracectl/run/endpoints.py).")
    model: str = Field(description="Served model name.")
    api_key_env: str = Field("", description="Variable of tracectl's environment holding the key: the key of the "
                             "embedded services' profile (and of the GEPA reflection calls, made by tracectl). A "
                             "deployed service uses its own profile's key; this name is never sent.")


class StoreSection(Section):
    root: str = Field("file://./.trace", description="Artifact store root: file:///dir or s3://bucket[/prefix].")
    s3_endpoint: str | None = Field(None, description="host:port of the S3 server for s3:// roots.")
    s3_access_key_env: str = Field("TRACE_S3_ACCESS_KEY", description="Env var holding the S3 access key.")
    s3_secret_key_env: str = Field("TRACE_S3_SECRET_KEY", description="Env var holding the S3 secret key.")
    s3_secure: bool = False

    @field_validator("root")
    @classmethod
    def _root(cls, v: str) -> str:
        if not v.startswith(("file://", "s3://")):
            raise ValueError(f"{v!r}: give file:///abs/dir (file://./dir is relative to where tracectl runs) or "
                             "s3://bucket[/prefix]")
        return v

    @model_validator(mode="after")
    def _endpoint(self) -> StoreSection:
        if self.root.startswith("s3://") and not self.s3_endpoint:
            raise ValueError("store.root is s3:// but store.s3_endpoint is unset: give the S3 server's host:port")
        return self


class TargetSection(Section):
    env: str = Field("store", description="Registered target environment (store, tau2-retail...).")
    uri: str = Field("", description="Data directory for data-backed targets (tau2), as a path or file:// URI.")
    params: dict[str, str] = Field(default_factory=dict)
    user_simulator: LlmSection | None = Field(None, description="LLM user simulator (tau2 targets).")


class BaseAgentSection(Section):
    name: str = Field("micro", description="'micro', 'smollm2', a local HF model dir, or a served model name.")
    backend: Literal["in-process", "http"] = "in-process"
    endpoint: str = Field("", description="OpenAI-compatible base URL when backend is http (vLLM).")
    warm_start: dict[str, Any] = Field(default_factory=dict, description="Warm-start overrides (built-in agents).")


class RolloutSection(Section):
    split: str = "train"
    limit: int = Field(64, ge=1, description="Target training tasks played by the base agent.")
    samples: int = Field(2, ge=1, description="Samples per task.")
    temperature: float = Field(1.0, ge=0.0)
    concurrency: int = Field(16, ge=1)


class AnalysisSection(Section):
    mode: Literal["diagnostics", "llm"] = "diagnostics"
    llm: LlmSection | None = None
    num_runs: int = Field(10, ge=1)
    min_passing_runs: int = Field(8, ge=1)
    min_coverage: float = Field(0.10, ge=0.0, le=1.0)
    min_gap: float = Field(0.20, ge=0.0, le=1.0)
    max_capabilities: int = Field(4, ge=1, description="Train at most this many retained capabilities (by coverage).")
    on_no_capability: Literal["stop", "baselines"] = Field(
        "stop", description="What a run does when the analysis retains no capability (or its job fails "
        "FAILED_PRECONDITION: the analyst model's replies were unusable) or the environments stage "
        "accepts no environment. 'stop': that stage fails, saying why. 'baselines': that stage and the later TRACE "
        "stages (environments, adapters, gates) complete with nothing, each saying so in one console line and "
        "recording why (`nothing_to_train`), and the evaluation plays only the arms that need no adapter (base, "
        "grpo_target with its budget curve, gepa) at TRACE's budget as counted (the rollout stage's episodes, plus "
        "calibration's when environments were calibrated but none accepted); best_single and the trace_* arms are "
        "recorded as not played, with the reason (e.g. a CPU rehearsal whose tiny analyst finds nothing). Here, in "
        "the analysis section, because it changes what the analysis and every later stage produce: a change re-runs "
        "from the analysis (the default leaves a run's stage hashes as they were before the field existed).")

    @model_validator(mode="after")
    def _llm(self) -> AnalysisSection:
        if self.mode == "llm" and self.llm is None:
            raise ValueError("analysis.mode is 'llm' but analysis.llm is missing: give base_url and model, "
                             "or use mode: diagnostics")
        if self.min_passing_runs > self.num_runs:
            raise ValueError(f"analysis.min_passing_runs ({self.min_passing_runs}) > num_runs ({self.num_runs})")
        return self


class EnvironmentsSection(Section):
    mode: Literal["library", "llm"] = "library"
    llm: LlmSection | None = None
    max_retries: int = Field(3, ge=0)
    calibration_reward_min: float = Field(0.2, gt=0.0, le=1.0, description="Lowest accepted mean reward of the base "
                                          "policy on a candidate environment (a small value such as 0.001 accepts "
                                          "any environment the base earns something on).")
    calibration_reward_max: float = Field(0.6, gt=0.0, le=1.0, description="Highest accepted mean reward.")
    calibration_min_informative: float | None = Field(
        None, ge=0.0, le=1.0, description="Lowest fraction of informative calibration groups (None: the environment "
                                          "service's setting, 0.5). 0 accepts environments where the base policy "
                                          "never varies; GRPO then relies on guided rollouts (training.grpo."
                                          "guidance_fraction).")


#: Fields of the GRPO configs that tracectl sets itself, from one run-level value each.
RUN_LEVEL_GRPO_FIELDS = {
    "max_completion_length": "set the run's one completion cap at the top level instead: max_completion_length: "
                             "{tokens: N, reason: '...'} (or leave it out and tracectl derives it from the target's "
                             "longest expert turn, tracectl/run/completion_cap.py); calibration, training, gates and "
                             "evaluation all use it",
    "initial_batches_uri": "tracectl passes each adapter its environment's calibration batches itself; remove it",
}


def _no_run_level_fields(section: str, config: dict[str, Any]) -> dict[str, Any]:
    for key, fix in RUN_LEVEL_GRPO_FIELDS.items():
        if key in config:
            raise ValueError(f"{section}.{key} is not a per-stage setting: {fix}")
    return config


class CompletionCapSection(Section):
    """The run's one completion cap, set by hand (tracectl derives it when this is absent)."""

    tokens: int = Field(ge=8, le=32768, description="Most tokens of one assistant turn, in every stage.")
    reason: str = Field(min_length=10, description="Why this value and not the derived one (e.g. a served base "
                        "model whose tokenizer tracectl cannot read, or a target without a scripted expert).")


class TrainingSection(Section):
    executor: Literal["local", "kubernetes"] = "local"
    parallel: int = Field(2, ge=1, description="Adapters trained at once.")
    grpo: dict[str, Any] = Field(default_factory=dict, description="GRPO config (TRL names), per adapter: "
                                 "services/trainer/grpo/config.py GRPOConfig, checked by the trainer before stage 1. "
                                 "Not max_completion_length (the run's one cap) nor initial_batches_uri (tracectl's).")

    @field_validator("grpo")
    @classmethod
    def _grpo(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _no_run_level_fields("training.grpo", v)


class GatesSection(Section):
    config: dict[str, Any] = Field(default_factory=dict, description="Gate training config: services/trainer/"
                                   "gates/config.py GateGRPOConfig, checked by the trainer before stage 1. Not "
                                   "max_completion_length (the run's one cap).")

    @field_validator("config")
    @classmethod
    def _config(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _no_run_level_fields("gates.config", v)


class EvaluationSection(Section):
    """Every arm on the same held-out tasks, greedy (tracectl/evaluation/stage.py). Fixed before any
    run: nothing here is tuned on the test split."""

    split: str = Field("test", description="Held-out split every arm plays.")
    limit: int = Field(0, ge=0, description="Tasks of `split` per arm; 0 = the whole split (the store's test split "
                       "is 600 compound tasks, where exact McNemar resolves a 4-point difference when 20 % of the tasks are "
                       "discordant; the report states it for the run).")
    dev_limit: int = Field(0, ge=0, description="Dev-split tasks each adapter plays to choose best_single; 0 = the "
                           "whole dev split.")
    probe_limit: int | None = Field(
        None, ge=0, description="Probe tasks each arm also plays (the per-capability breakdown): tasks of the probe "
        "env's `split`, i.e. the target with `probe_params`. None: 100 for the built-in store target (25 per probe "
        "type), 0 (no probes) for any other target; 0 turns them off.")
    probe_params: dict[str, str] = Field(default_factory=lambda: {"task_types": "probes"},
                                         description="Target params that select the probe env.")
    temperature: float = Field(0.0, ge=0.0, description="Decoding temperature of every arm (0: greedy).")
    trials: int = Field(1, ge=1, le=9, description="Trials per test task for every arm (tau2's pass^k convention, k = "
                        "trials): with trials > 1 the task is the unit (pass rate = mean over tasks, bootstrap "
                        "interval over tasks, pass^1..pass^k) and the paired test is a sign-flip permutation "
                        "over tasks, not McNemar. Probes and dev runs play one trial.")
    arms: list[Arm] = Field(default_factory=lambda: ["base", "best_single", "grpo_target", "trace_routing",
                                                     "trace_per_request", "trace_soft"])
    grpo_budgets: list[float] = Field(
        default_factory=lambda: [0.5, 1.0, 2.0, 4.0],
        description="GRPO on the target at these multiples of TRACE's total budget (every episode TRACE played): "
        "one run to the largest, checkpointed at each, every point evaluated on `split`; the grpo_target arm is "
        "the 1x point, so the list must hold 1.")
    parallel: int = Field(2, ge=1, le=16, description="Arms evaluated at once (each its own rollout or training "
                          "job); finished arms are kept by a killed run either way.")
    bootstrap_samples: int = Field(10_000, ge=100, le=1_000_000,
                                   description="Resamples of the paired bootstrap interval (seeded by `seed`).")
    gepa: LlmSection | None = Field(None, description="Reflection LLM for the GEPA prompt-optimization arm.")
    gepa_search: dict[str, Any] = Field(default_factory=dict, description="The GEPA arm's search knobs "
                                        "(tracectl/evaluation/gepa.py GepaSettings: val_size, minibatch_size, "
                                        "acceptance, ...); unset ones keep gepa's defaults.")

    @field_validator("grpo_budgets")
    @classmethod
    def _budgets(cls, v: list[float]) -> list[float]:
        if not v or any(not 0 < m <= 64 for m in v):
            raise ValueError(f"grpo_budgets={v}: give multiples of TRACE's budget in (0, 64], e.g. [0.5, 1, 2, 4]")
        return sorted(set(float(m) for m in v))

    @field_validator("gepa_search")
    @classmethod
    def _gepa_search(cls, v: dict[str, Any]) -> dict[str, Any]:
        from tracectl.evaluation.gepa import GepaSettings  # the arm owns its knobs

        GepaSettings.model_validate(v)
        return v

    @model_validator(mode="after")
    def _arms(self) -> EvaluationSection:
        if "gepa" in self.arms and self.gepa is None:
            raise ValueError("evaluation.arms includes 'gepa' but evaluation.gepa (a reflection LLM endpoint) is "
                             "missing; add it or drop the arm")
        if len(set(self.arms)) != len(self.arms):
            raise ValueError(f"evaluation.arms lists an arm twice: {self.arms}")
        if "grpo_target" in self.arms and 1.0 not in self.grpo_budgets:
            raise ValueError(f"evaluation.grpo_budgets={self.grpo_budgets} lacks 1: the grpo_target arm is GRPO at "
                             "TRACE's own budget; add 1 to the list")
        return self

    def probes_for(self, target_env: str) -> int:
        """Probe tasks per arm for a run on `target_env` (`probe_limit`, None resolved)."""
        if self.probe_limit is not None:
            return self.probe_limit
        return 100 if target_env == "store" else 0


class RunConfig(Section):
    run_id: str = Field(description="Names the run directory runs/<run_id>/ (letters, digits, '-', '_').")
    seed: int = 0
    services: dict[str, str] = Field(default_factory=dict, description="service -> host:port; empty = embedded.")
    store: StoreSection = StoreSection()
    target: TargetSection = TargetSection()
    base_agent: BaseAgentSection = BaseAgentSection()
    rollout: RolloutSection = RolloutSection()
    analysis: AnalysisSection = AnalysisSection()
    environments: EnvironmentsSection = EnvironmentsSection()
    training: TrainingSection = TrainingSection()
    gates: GatesSection = GatesSection()
    evaluation: EvaluationSection = EvaluationSection()
    max_completion_length: CompletionCapSection | None = Field(
        None, description="The one completion cap of every stage, set by hand with its reason; absent: derived from "
        "the target's longest expert turn in the base agent's tokens (tracectl/run/completion_cap.py).")

    @field_validator("run_id")
    @classmethod
    def _run_id(cls, v: str) -> str:
        from trace_common.jobs import RUN_ID_RE

        if not RUN_ID_RE.match(v):
            raise ValueError(f"run_id {v!r}: use 1-64 letters, digits, '-' or '_' (e.g. demo-1)")
        return v

    @field_validator("services")
    @classmethod
    def _services(cls, v: dict[str, str]) -> dict[str, str]:
        unknown = set(v) - set(SERVICE_NAMES)
        if unknown:
            hints = "".join(did_you_mean(u, SERVICE_NAMES) for u in sorted(unknown))
            raise ValueError(f"unknown {sorted(unknown)}; known: {', '.join(SERVICE_NAMES)}{hints}")
        return v

    @model_validator(mode="after")
    def _trials(self) -> RunConfig:
        ev = self.evaluation
        if ev.trials > 1 and ev.temperature == 0.0 and self.target.env == "store" and self.target.user_simulator is None:
            raise ValueError(f"evaluation.trials={ev.trials} with evaluation.temperature 0 on the store: its user is "
                             "scripted and decoding greedy, so every trial would replay the same episode; set "
                             "evaluation.temperature > 0 (sampled trials) or trials: 1")
        return self

    #: Fields that say how a stage is scheduled, not what it computes (how many episodes, adapters or
    #: arms run at once; where training runs): left out of the hashes, so lowering `evaluation.parallel`
    #: after running out of memory keeps every finished arm instead of re-running the stage.
    SCHEDULING_FIELDS: ClassVar[dict[str, frozenset[str]]] = {
        "rollout": frozenset({"concurrency"}), "training": frozenset({"executor", "parallel"}),
        "evaluation": frozenset({"parallel"})}

    def section(self, stage: str, *, legacy: bool = False) -> dict[str, Any]:
        """The configuration stage `stage` depends on directly (for manifest hashes), without the
        SCHEDULING_FIELDS; `legacy=True`: with them, as runs recorded before 2026-12-07 hashed it (the
        pipeline accepts either, so such a run resumes as it was)."""
        by_stage = {"rollout": [self.target, self.base_agent, self.rollout], "analysis": [self.analysis],
                    "environments": [self.environments], "adapters": [self.training], "gates": [self.gates],
                    "evaluation": [self.evaluation], "report": []}
        # fields added later are left out at their defaults, so runs recorded before them keep their hashes
        unset = {id(self.analysis): {"on_no_capability"} if self.analysis.on_no_capability == "stop" else set(),
                 id(self.evaluation): set() if self.evaluation.gepa_search else {"gepa_search"}}
        if not legacy:
            for name, fields in self.SCHEDULING_FIELDS.items():
                part = getattr(self, name)
                unset[id(part)] = unset.get(id(part), set()) | fields
        parts = [p.model_dump(exclude=unset.get(id(p)) or None) for p in by_stage[stage]]
        out = {"seed": self.seed, "parts": parts}
        if stage == "rollout":   # the rollout stage fixes the one completion cap every later stage uses
            cap = self.max_completion_length
            out["max_completion_length"] = cap.model_dump() if cap is not None else "derived from the target"
        return out


def load_config(path: Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """The run config in `path` (YAML), or InvalidArgument: one line for a file that is not a YAML
    mapping (tracectl/inputs.py), one line per wrong field otherwise, each naming the field by its
    dotted path with the closest valid name for a mistyped key or choice."""
    data = read_yaml_mapping(path, "--config", fix="A run config is a YAML mapping of sections; see "
                             "examples/demo.yaml")
    data.update(overrides or {})
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        lines = error_lines(err, RunConfig)
        sep = " " if len(lines) == 1 else "\n  "
        raise InvalidArgument(f"{path}: invalid run config:{sep}" + "\n  ".join(lines)) from None


def grpo_target_config(grpo: dict[str, Any]) -> dict[str, Any]:
    """The adapters' GRPO settings as the grpo_target arm trains with them: unguided, because the
    target supplies no hints (asking would fail the job), and never stopped early: the arm plays its
    whole budget, as TRACE did. On a target where the base passes nothing every group is
    uninformative, and the adapters' early stop would fail the job; here the policy simply stays where
    it started, which is the result to report. Nor does it re-collect uninformative groups
    (`max_resample_rounds` 0): its budget points are checkpoints chosen by iteration
    (`evaluation.curve_iterations`: it(m) = ceil(m B / (groups_per_batch num_generations))), which
    play m B episodes only when every iteration plays its nominal batch; with re-collection the "1x"
    checkpoint of the demo's seed 0 (commit 17a1648) had played 2,720 episodes against TRACE's 1,084.
    tracectl/evaluation/stage.py adds max_steps and checkpoint_at."""
    return {**grpo, "guidance_fraction": 0.0, "early_stop_uninformative_iterations": 0, "max_resample_rounds": 0}
