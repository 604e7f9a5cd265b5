"""What TRACE spent before the evaluation, read back from its stage records and artifacts.

`trace_budget`: every episode TRACE played before the evaluation, per component, with the tokens
beside them wherever a job reports them (docs/design.md "Evaluation": a method's budget counts
every episode it played). Pure over the run's stage records and the artifacts they name, so a
resumed run accounts exactly what an uninterrupted one does: every count comes from what the jobs
recorded (trajectories, validation reports, the trainer's running totals), never from how many
attempts a stage took.

Budget semantics (`trace_budget`):
    rollout       episodes and tokens of the rollout stage's trajectories (the base agent's)
    calibration   per environment candidate (accepted or rejected): the episodes its validation
                  report's calibration check played (len of every group's rewards); for each
                  earlier generation attempt (LLM mode retries, library mode's harder levels)
                  the episodes its attempt record counted (`calibration_episodes`); a report
                  written before attempts counted them gets groups x group_size of the
                  report's config per attempt unless it stopped before calibrating (a failed
                  extract/static/loads/deterministic/oracle check) -- a bound from above,
                  marked as such. No tokens: the environment service reports none for
                  calibration.
    adapters      per adapter job: the trainer's rollouts_total, prompt_tokens_total,
                  completion_tokens_total (guided and resampled episodes included): what the job
                  played. Its first iterations train on its environment's calibration episodes
                  (initial_batches_uri); those are counted once, under calibration where they
                  were played, and shown here as `trained_calibration_episodes` (the trainer's
                  initial_batch_episodes_total), never added again
    gates         the gates job's rollouts_total (the warm start's episodes -- every slot's replays
                  on target training tasks with outcome labels, the trainer's default, or the
                  provenance episodes -- + GRPO with its re-collected groups; warm_start_rollouts is
                  the warm-start part, `warm_start_labels` says which) and its token totals
    total         sum of the components' episodes; tokens summed over the components that report them
A stage that recorded nothing to train (analysis.on_no_capability 'baselines') ran no job: its
component is 0 episodes and 0 tokens, its source saying why; calibration still counts every
candidate that was calibrated and rejected.
A job whose metrics lack rollouts_total (an older trainer) is counted from its config
(max_steps x groups_per_batch x num_generations, plus for gates the warm start its config's
warm_start_labels asks for: warm_start_tasks x (K+1) x warm_start_samples_per_slot replays with
outcome labels, K x warm_start_episodes with provenance labels) and marked "estimated": never silently.
Every config value comes from the configs as the trainer parses them (its defaults filled in:
ValidateTrainingConfig, `Pipeline.parsed_config`), never from defaults re-typed here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from trace_common.errors import NotFound
from tracectl.evaluation.scoring import read_trajectories, trajectory_tokens
from tracectl.run.jobs import StageFailed
from tracectl.run.results import BudgetComponent, CalibrationCount, JobTotals, RunResults, TraceBudget

#: A validation that fails one of these checks stops before the calibration check (validation.py).
STOPS_BEFORE_CALIBRATION = ("extract", "static", "loads", "deterministic", "oracle")


class GrpoCounts(BaseModel):
    """The fields of a GRPO config, as the trainer parses it, that episodes are counted with."""

    model_config = ConfigDict(extra="ignore")
    max_steps: int
    groups_per_batch: int
    num_generations: int

    @property
    def nominal_episodes(self) -> int:
        """max_steps x groups_per_batch x num_generations: a job's episodes without re-collection."""
        return self.max_steps * self.groups_per_batch * self.num_generations


class GatesCounts(GrpoCounts):
    """The fields of a gates config, as the trainer parses it, that its warm start is counted with."""

    warm_start_steps: int
    warm_start_labels: str
    warm_start_episodes: int
    warm_start_tasks: int
    warm_start_samples_per_slot: int


def _component(episodes: int, prompt: float | None, completion: float | None, source: str,
               **extra: Any) -> BudgetComponent:
    return BudgetComponent(episodes=int(episodes), prompt_tokens=None if prompt is None else int(prompt),
                           completion_tokens=None if completion is None else int(completion), source=source, **extra)


def _sum_tokens(parts: Iterable[BudgetComponent], key: str) -> int | None:
    vals = [getattr(p, key) for p in parts]
    return None if any(v is None for v in vals) else int(sum(vals))


def calibration_episodes(report: Mapping[str, Any]) -> CalibrationCount:
    """Calibration episodes one validation report (the environment service's JSON) accounts for
    (module docstring)."""
    final = 0
    for check in report.get("checks", []):
        if check.get("name") == "calibration":
            final += sum(len(g) for g in (check.get("details") or {}).get("rewards", []))
    earlier = list(report.get("attempts") or [])[:-1]
    exact = sum(int(a["calibration_episodes"]) for a in earlier if a.get("calibration_episodes") is not None)
    unrecorded = [a for a in earlier if a.get("calibration_episodes") is None]
    ran = [a for a in unrecorded
           if not any(str(r).split(":", 1)[0].strip() in STOPS_BEFORE_CALIBRATION for r in a.get("reasons", []))]
    cfg = report.get("config") or {}
    if ran and not ("groups" in cfg and "group_size" in cfg):
        raise StageFailed("a validation report with earlier attempts that recorded no calibration episodes "
                          "has no config.groups / config.group_size to bound them with; re-run the environments "
                          "stage")
    per_attempt = int(cfg["groups"]) * int(cfg["group_size"]) if ran else 0
    return CalibrationCount(episodes=final + exact + per_attempt * len(ran), final_attempt=final,
                            earlier_attempts=len(earlier), earlier_attempt_episodes=exact,
                            earlier_attempt_episodes_bound=per_attempt * len(ran))


def warm_start_episodes(gates: GatesCounts, k: int) -> int:
    """Episodes the gates job's warm start plays over `k` adapters under the parsed gates config
    (module docstring): none without warm-start steps; provenance labels play each adapter's
    environment (slot 0's episodes are the rollout stage's, counted there); outcome labels replay
    every task with every slot (the base and each adapter)."""
    if not gates.warm_start_steps:
        return 0
    if gates.warm_start_labels == "provenance":
        return k * gates.warm_start_episodes
    return gates.warm_start_tasks * (k + 1) * gates.warm_start_samples_per_slot


def _job_component(metrics: Mapping[str, Any] | None, estimate: Callable[[], int], what: str,
                   **extra: Any) -> BudgetComponent:
    totals = JobTotals.of(metrics)
    if totals.rollouts_total is None:
        return _component(estimate(), None, None, f"estimated from the config ({what} reported no rollouts_total)",
                          estimated=True, **extra)
    return _component(int(totals.rollouts_total), totals.prompt_tokens_total, totals.completion_tokens_total,
                      "trainer rollouts_total", **extra)


def trace_budget(store, stages: Mapping[str, Any], grpo: Callable[[], GrpoCounts],
                 gates: Callable[[], GatesCounts]) -> TraceBudget:
    """Every episode TRACE played before the evaluation (module docstring), from the stage records
    (`Manifest.stages`) and the artifacts they name. `grpo`, `gates`: the run's training.grpo and
    gates.config as the trainer parses them, called only when a job reported no totals (an estimate)
    or, for the gates' warm-start labels, when the gates stage did not record them (an older run):
    a run whose jobs reported their totals is counted without asking the trainer anything."""
    results = RunResults(stages)
    uri = stages["rollout"].outputs.get("trajectories")
    if not uri:
        raise StageFailed("the budget needs the rollout stage's trajectories; the rollout stage recorded none")
    trajs = read_trajectories(store, uri)
    prompt, completion = trajectory_tokens(trajs)
    components: dict[str, BudgetComponent] = {
        "rollout": _component(len(trajs), prompt, completion, "rollout stage trajectories")}

    per_env: dict[str, CalibrationCount] = {}
    for rec in results.environments.environments:
        report_uri = rec.validation_report.uri if rec.validation_report else ""
        name = rec.capability or rec.name or "?"
        if not report_uri:
            raise StageFailed(f"environment {name!r} has no validation report: its calibration episodes cannot be "
                              "counted (re-run the environments stage)")
        try:
            report = json.loads(store.get_bytes(store.key_of(report_uri)))
        except NotFound:
            raise StageFailed(f"the validation report of environment {name!r} ({report_uri}) is gone: its "
                              "calibration episodes cannot be counted; re-run from the environments stage") from None
        per_env[name] = calibration_episodes(report).model_copy(update={"status": rec.status})
    bound = any(e.earlier_attempt_episodes_bound for e in per_env.values())
    components["calibration"] = _component(
        sum(e.episodes for e in per_env.values()), None, None,
        "validation reports" + (" (earlier attempts: bound from above)" if bound else ""),
        per_environment=per_env, tokens_note="the environment service reports no tokens for calibration")

    adapters = stages["adapters"].outputs
    metrics = results.adapters.metrics
    per_adapter = {cap: _job_component(metrics.get(cap), lambda: grpo().nominal_episodes, f"adapter job {cap}")
                   for cap in sorted(adapters)}
    for cap, a in per_adapter.items():   # calibration episodes it trained on: counted under calibration
        a.trained_calibration_episodes = int(JobTotals.of(metrics.get(cap)).initial_batch_episodes_total or 0)
    no_adapters = results.adapters.nothing_to_train
    components["adapters"] = _component(
        sum(a.episodes for a in per_adapter.values()), _sum_tokens(per_adapter.values(), "prompt_tokens"),
        _sum_tokens(per_adapter.values(), "completion_tokens"),
        f"no job: {no_adapters}" if no_adapters else "trainer rollouts_total"
        if not any(a.estimated for a in per_adapter.values()) else "trainer rollouts_total, some estimated",
        per_adapter=per_adapter,
        trained_calibration_episodes=sum(a.trained_calibration_episodes or 0 for a in per_adapter.values()))

    if results.gates.nothing_to_train:   # no gates job ran: nothing played, nothing to ask the trainer
        gc = _component(0, 0, 0, f"no job: {results.gates.nothing_to_train}")
    else:
        gm = results.gates.metrics
        gc = _job_component(gm, lambda: warm_start_episodes(gates(), len(adapters)) + gates().nominal_episodes,
                            "the gates job")
        warm = JobTotals.of(gm).warm_start_rollouts
        warm_n = int(warm) if warm is not None and not gc.estimated else warm_start_episodes(gates(), len(adapters))
        labels = results.gates.warm_start_labels or gates().warm_start_labels
        gc.warm_start_episodes, gc.grpo_episodes, gc.warm_start_labels = warm_n, gc.episodes - warm_n, labels
    components["gates"] = gc

    parts = list(components.values())
    return TraceBudget(components=components, total_episodes=sum(c.episodes for c in parts),
                       training_episodes=components["adapters"].episodes + gc.episodes,
                       total_prompt_tokens=sum(c.prompt_tokens or 0 for c in parts),
                       total_completion_tokens=sum(c.completion_tokens or 0 for c in parts),
                       tokens_missing=[k for k, c in components.items() if c.prompt_tokens is None])
