"""A run's results as typed records: what every stage recorded, what each evaluation arm scored and
spent, TRACE's budget, the paired comparisons.

The manifest stores each stage's result as JSON (`StageRecord.result`, manifest.py); this module is
the one place that knows its shape. Writers build these models and store `dump(model)`; readers
call `results_of(manifest)` (or `<Model>.model_validate`) and read attributes. Nothing else in
tracectl reads a stage or arm record through a string key (tests/unit/run/test_results.py scans the
source for that).

Reading older runs (the tolerant reader): every model keeps the fields it does not declare
(`extra="allow"`: rewriting an older record keeps what this code does not know), gives every field
a run may lack a default, and accepts the names older runs wrote (`training_rollouts` for
`training_episodes`, `trace_training_rollouts` for `trace_budget_episodes`: both held episodes, the
old names said rollouts). A manifest written before this module existed loads and renders the
same report (tests/fixtures/report/). The other way does not hold: code from before this module
reads the old names only, so it cannot render or resume a run written by this code.

Field names follow what the jobs report: `episodes` are played episodes (a rollout job's, or every
episode a method played for `training_episodes`), tokens are prompt + completion as the trainer
counts them (every assistant turn's full prompt and its completion), None where a part reported
none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field


class Record(BaseModel):
    """A stored record: unknown fields kept (module docstring), fields set by name."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


def dump(record: BaseModel) -> dict[str, Any]:
    """`record` as the JSON-ready mapping the manifest stores (declared names, never the aliases).
    Unknown values (None) are left out, as the records before this model left them out: every field
    that may be None defaults to None, so a read gives the same record back."""
    return record.model_dump(mode="json", exclude_none=True)


# -- one rollout job and what an arm scored -----------------------------------------------------------
class Rate(Record):
    """A pass rate over `n` episodes with its 95 % interval (Wilson at one trial per task)."""

    n: int
    pass_rate: float
    ci: list[float]


class SubgoalRate(Record):
    """Sub-requests needing a capability that did not fail on it (the report computes these)."""

    met: int
    total: int
    rate: float | None = None


class Rollout(Record):
    """One rollout job's summary, as the rollout service returns it."""

    job: str = Field("", description="The rollout job's id.")
    uri: str = Field("", description="Its trajectories (JSON lines).")
    episodes: int = 0
    successes: int = 0
    pass_rate: float = 0.0
    ci: list[float] = Field(default_factory=lambda: [0.0, 0.0], description="95 % interval of pass_rate.")
    reward_mean: float | None = None
    wall_seconds: float | None = Field(None, description="The job's own wall time (service clock).")


class Scored(Rollout):
    """A rollout job read back for the paired statistics (tracectl/evaluation/scoring.py `arm_summary`)."""

    outcomes: str = Field("", description="One digit per task sorted by seed: '0'/'1' at one trial, else "
                                          "its successes out of `trials`.")
    task_ids_sha256: str = Field("", description="Digest of that task order: two arms pair only on the same.")
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    trials: int = Field(1, description="Trials per task (tau2's pass^k convention); 1 for older runs.")
    tasks: int | None = Field(None, description="Tasks played (only recorded at trials > 1).")
    pass_hat_k: dict[str, float] = Field(default_factory=dict, description="pass^1 .. pass^trials (trials > 1).")


class DevRun(Rollout):
    """best_single: one adapter on the dev split."""

    tokens: int | None = Field(None, description="Prompt + completion tokens, None when none were recorded.")


class CurveRun(Record):
    """The budget curve's one GRPO job, as the evaluation records it (a unit)."""

    job: str
    uri: str = Field(description="The final adapter.")
    train_seconds: float = 0.0
    max_steps: int
    checkpoint_at: list[int] = Field(default_factory=list)
    per_iteration: int
    metrics: dict[str, Any] = Field(default_factory=dict)
    checkpoints: dict[str, str] = Field(default_factory=dict, description="Iteration -> its PEFT adapter.")
    history: dict[str, dict[str, float]] = Field(default_factory=dict, description="Iteration -> the trainer's "
                                                 "running totals at it (rollouts_total, token totals).")
    iterations: int


class Probes(Scored):
    """An arm's run on the probe env (single-capability tasks)."""

    by_probe: dict[str, Rate] = Field(default_factory=dict)


class ArmResult(Scored):
    """One evaluation arm: its test run, what the method spent, and the arm's own facts."""

    breakdown: dict[str, Rate] = Field(default_factory=dict, description="Per required capability (compound "
                                       "tasks count for each they need) or task type.")
    training_episodes: int = Field(0, validation_alias=AliasChoices("training_episodes", "training_rollouts"),
                                   description="Every episode the method played before the test (TRACE: its "
                                               "whole budget; the base: 0).")
    training_tokens: int | None = Field(None, description="Prompt + completion tokens of the parts that report them.")
    training_tokens_missing: list[str] = Field(default_factory=list, description="Parts that report no tokens.")
    wall_seconds_total: float | None = Field(None, description="Training (if the arm trains) plus its test run.")
    train_seconds: float = 0.0
    probes: Probes | None = None
    jobs: list[str] | None = Field(None, description="Every job of the arm (GEPA's search and test), if several.")
    # best_single
    adapter: str | None = Field(None, description="best_single: the capability chosen on dev.")
    dev_pass_rates: dict[str, float] | None = Field(None, description="best_single: each adapter's dev pass rate.")
    dev_episodes: int | None = Field(None, description="best_single: the dev episodes choosing it (in its budget).")
    # a GRPO-on-the-target checkpoint
    adapter_uri: str | None = None
    iteration: int | None = None
    budget_multiple: float | None = None
    # gepa
    prompt: str | None = Field(None, description="gepa: the optimised system prompt.")
    prompt_sha256: str | None = None
    prompt_uri: str | None = None
    search_uri: str | None = None
    seed_prompt_sha256: str | None = None
    gepa: dict[str, Any] | None = Field(None, description="gepa: the search's summary (tracectl/evaluation/gepa.py).")

    @property
    def tasks_played(self) -> int:
        """Tasks of the test run (episodes at one trial per task)."""
        return self.tasks if self.trials > 1 and self.tasks is not None else self.episodes


# -- TRACE's budget -----------------------------------------------------------------------------------
class CalibrationCount(Record):
    """Calibration episodes one validation report accounts for (tracectl/evaluation/budget.py)."""

    episodes: int
    final_attempt: int = 0
    earlier_attempts: int = 0
    earlier_attempt_episodes: int = 0
    earlier_attempt_episodes_bound: int = Field(0, description="Earlier attempts that recorded no count: "
                                                "groups x group_size each, a bound from above.")
    status: str = ""


class BudgetComponent(Record):
    """Episodes and tokens one component of TRACE played (budget.py's semantics table)."""

    episodes: int
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    source: str = ""
    estimated: bool = Field(False, description="Counted from the config: the job reported no rollouts_total.")
    tokens_note: str | None = None
    per_environment: dict[str, CalibrationCount] | None = None
    per_adapter: dict[str, BudgetComponent] | None = None
    trained_calibration_episodes: int | None = Field(None, description="Calibration episodes trained on "
                                                     "(counted under calibration, never again).")
    warm_start_episodes: int | None = None
    grpo_episodes: int | None = None
    warm_start_labels: str | None = None

    @property
    def tokens(self) -> int | None:
        """Prompt + completion, None when the component reports none."""
        return None if self.prompt_tokens is None else self.prompt_tokens + (self.completion_tokens or 0)


class TraceBudget(Record):
    """Every episode TRACE played before the evaluation, per component."""

    components: dict[str, BudgetComponent]
    total_episodes: int
    training_episodes: int = 0
    total_prompt_tokens: int = 0
    total_completion_tokens: int = 0
    tokens_missing: list[str] = Field(default_factory=list)


# -- the GRPO budget curve, paired statistics --------------------------------------------------------
class CurvePoint(Record):
    """One point of GRPO on the target: the checkpoint at `multiple` x TRACE's budget."""

    multiple: float
    iteration: int
    name: str
    skipped: str | None = Field(None, description="Why this point has no checkpoint to evaluate.")
    estimated: bool | None = None
    pass_rate: float | None = None
    ci: list[float] | None = None
    episodes: int | None = None
    successes: int | None = None
    training_episodes: int | None = Field(None, validation_alias=AliasChoices("training_episodes",
                                                                              "training_rollouts"))
    training_tokens: int | None = None


class CurveTraining(Record):
    """The curve's one GRPO run."""

    job: str
    max_steps: int
    checkpoint_at: list[int]
    per_iteration: int
    iterations: int
    train_seconds: float = 0.0


class PairedComparison(Record):
    """TRACE routing (x) against one arm (y) on the same tasks (trace_common/stats.py)."""

    n: int
    pass_rate_x: float
    pass_rate_y: float
    diff: float
    only_x: int
    only_y: int
    p_value: float
    ci: list[float]
    both: int | None = None
    neither: int | None = None
    trials: int | None = None
    test: str | None = Field(None, description="At trials > 1: the test used (a sign-flip permutation).")


class Paired(Record):
    reference: str
    vs: dict[str, PairedComparison] = Field(default_factory=dict)


class Power(Record):
    """What the test size resolves: McNemar's detectable difference per discordance at one trial,
    the observed spread of per-task differences at several."""

    n: int
    alpha: float
    min_detectable: dict[str, float | None] | None = None
    observed_discordance: dict[str, float] | None = None
    trials: int | None = None
    power: float | None = None
    observed_sd: dict[str, float] | None = None
    min_detectable_observed: dict[str, float | None] | None = None


class ExpertUsage(Record):
    """Per task type, how the gates route the reply's tokens (tracectl/run/routing.py)."""

    experts: list[str] = Field(default_factory=list)
    rows: dict[str, list[list[int]]] = Field(default_factory=dict, description="[position bucket][expert] counts.")
    episodes: int = 0


class RoutedToken(Record):
    text: str
    expert_index: int
    expert: str
    layers: list[int] = Field(default_factory=list)


class RoutedExample(Record):
    task_id: str = ""
    task_type: str = ""
    experts: list[str] = Field(default_factory=list)
    distinct: int | None = None
    tokens: list[RoutedToken] = Field(default_factory=list)


class EvaluationResult(Record):
    """The evaluation stage's result."""

    arms: dict[str, ArmResult] = Field(default_factory=dict)
    budget: TraceBudget | None = None
    trace_budget_episodes: int | None = Field(None, validation_alias=AliasChoices("trace_budget_episodes",
                                                                                  "trace_training_rollouts"),
                                              description="B: TRACE's whole budget in episodes.")
    grpo_curve: list[CurvePoint] = Field(default_factory=list)
    grpo_curve_points: dict[str, ArmResult] = Field(default_factory=dict, description="The curve's points "
                                                    "other than 1x (that one is arms['grpo_target']).")
    grpo_curve_training: CurveTraining | None = None
    paired: Paired | None = None
    power: Power | None = None
    routed_example: RoutedExample | None = None
    expert_usage: ExpertUsage | None = None
    arms_not_played: dict[str, str] = Field(default_factory=dict, description="Arms of evaluation.arms left out, "
                                            "each with why: under analysis.on_no_capability 'baselines' with nothing "
                                            "trained, the arms that need adapters (best_single, trace_*).")


# -- the other stages -----------------------------------------------------------------------------------
class CompletionCap(Record):
    """The run's one completion cap and how it was reached (tracectl/run/completion_cap.py)."""

    tokens: int
    source: str = Field("", description="'config' (max_completion_length set) or 'derived' (from the expert).")
    reason: str | None = None
    longest_expert_turn: int | None = None
    margin: int | None = None
    expert_episodes: int | None = None
    expert_replies: int | None = None
    expert_job: str | None = None
    expert_trajectories: str | None = None
    tokenizer: str | None = None


class RolloutStageResult(Rollout):
    max_completion_length: CompletionCap | None = None


class CapabilityRecord(Record):
    name: str
    description: str = ""
    evidence: list[str] = Field(default_factory=list)
    failed_task_ids: list[str] = Field(default_factory=list)


class Candidate(Record):
    """One candidate capability of the analysis (proto CapabilityResult, defaults omitted)."""

    capability: CapabilityRecord
    retained: bool = False
    coverage_mean: float = 0.0
    gap_mean: float = 0.0
    passing_runs: int = 0
    rejection_reason: str = ""
    coverage_std: float = 0.0
    gap_std: float = 0.0


class UnexplainedFailures(Record):
    """Failed rollout trajectories no capability explains (proto UnexplainedFailures)."""

    failed: int = Field(0, description="Failed trajectories the analysis runs drew.")
    by_retained: int = Field(0, description="Of those, LACKING none of the retained capabilities.")
    by_candidates: int = Field(0, description="Of those, LACKING none of the candidates.")


class AnalysisResult(Record):
    candidates: list[Candidate] = Field(default_factory=list)
    capabilities: list[CapabilityRecord] = Field(default_factory=list, description="The retained ones trained.")
    mode: str | None = None
    unexplained_failures: UnexplainedFailures | None = Field(
        None, description="What no capability explains; None: an analysis service without the field (older runs).")
    nothing_to_train: str | None = Field(None, description="Why this stage trained or generated nothing "
                                         "(analysis.on_no_capability 'baselines'); None: it did its work.")


class ArtifactLink(Record):
    uri: str = ""


ACCEPTED = "VALIDATION_STATUS_ACCEPTED"


class EnvironmentRecord(Record):
    """One generated environment (proto EnvironmentRecord, defaults omitted)."""

    name: str = ""
    version: str = ""
    capability: str = ""
    status: str = ""
    code: ArtifactLink | None = None
    validation_report: ArtifactLink | None = None
    rejection_reasons: list[str] = Field(default_factory=list)
    mode: str = ""
    calibration_reward_mean: float | None = None
    calibration_informative_fraction: float | None = None

    @property
    def accepted(self) -> bool:
        return self.status == ACCEPTED


class EnvironmentsResult(Record):
    environments: list[EnvironmentRecord] = Field(default_factory=list, description="Every candidate, the "
                                                  "rejected ones included (their calibration is in TRACE's budget).")
    accepted: list[str] = Field(default_factory=list)
    nothing_to_train: str | None = Field(None, description="Why this stage trained or generated nothing "
                                         "(analysis.on_no_capability 'baselines'); None: it did its work.")


class JobTotals(Record):
    """The running totals a training job reports in its metrics (the trainer's names), None when absent
    or not finite (an older trainer; a NaN a stage record kept)."""

    rollouts_total: float | None = None
    prompt_tokens_total: float | None = None
    completion_tokens_total: float | None = None
    initial_batch_episodes_total: float | None = None
    warm_start_rollouts: float | None = None

    @classmethod
    def of(cls, metrics: dict[str, Any] | None) -> JobTotals:
        import math

        def finite(v: Any) -> float | None:
            try:
                f = float(v)
            except (TypeError, ValueError):
                return None
            return f if math.isfinite(f) else None
        return cls(**{k: finite((metrics or {}).get(k)) for k in cls.model_fields})


class AdaptersResult(Record):
    metrics: dict[str, dict[str, Any]] = Field(default_factory=dict, description="Each job's metrics.")
    curves: dict[str, str] = Field(default_factory=dict, description="Each job's per-iteration metrics (URI).")
    tensorboard: dict[str, str] = Field(default_factory=dict, description="Each job's newest event file.")
    initial_batches: dict[str, str] = Field(default_factory=dict)
    max_steps_raised: dict[str, int] = Field(default_factory=dict)
    nothing_to_train: str | None = Field(None, description="Why this stage trained or generated nothing "
                                         "(analysis.on_no_capability 'baselines'); None: it did its work.")


class GatesResult(Record):
    metrics: dict[str, Any] = Field(default_factory=dict)
    warm_start_labels: str | None = Field(None, description="'outcome' or 'provenance', as the trainer parsed "
                                          "gates.config (runs before it was recorded: absent).")
    nothing_to_train: str | None = Field(None, description="Why this stage trained or generated nothing "
                                         "(analysis.on_no_capability 'baselines'); None: it did its work.")


class StageOutcome(Record):
    """What a stage returns to the driver (pipeline.py `run`): recorded as its StageRecord's fields."""

    outputs: dict[str, str] = Field(default_factory=dict, description="Artifact kind (or capability) -> URI.")
    jobs: list[str] = Field(default_factory=list)
    result: dict[str, Any] = Field(default_factory=dict, description="The stage's result record, as stored.")


class ReportResult(Record):
    missing_sections: dict[str, str] = Field(default_factory=dict)


STAGE_RESULTS: dict[str, type[Record]] = {
    "rollout": RolloutStageResult, "analysis": AnalysisResult, "environments": EnvironmentsResult,
    "adapters": AdaptersResult, "gates": GatesResult, "evaluation": EvaluationResult, "report": ReportResult}


class RunResults:
    """The typed view of a manifest's stage records' results (`Manifest.stages`), each read once, on
    first use."""

    def __init__(self, stages: Mapping[str, Any]) -> None:
        self._stages = stages
        self._cache: dict[str, Record] = {}

    def _get(self, stage: str) -> Any:
        if stage not in self._cache:
            self._cache[stage] = STAGE_RESULTS[stage].model_validate(self._stages[stage].result)
        return self._cache[stage]

    @property
    def rollout(self) -> RolloutStageResult:
        return self._get("rollout")

    @property
    def analysis(self) -> AnalysisResult:
        return self._get("analysis")

    @property
    def environments(self) -> EnvironmentsResult:
        return self._get("environments")

    @property
    def adapters(self) -> AdaptersResult:
        return self._get("adapters")

    @property
    def gates(self) -> GatesResult:
        return self._get("gates")

    @property
    def evaluation(self) -> EvaluationResult:
        return self._get("evaluation")


def results_of(manifest) -> RunResults:
    return RunResults(manifest.stages)
