"""What an evaluation arm spent and scored, read back from its artifacts and stage records.

Shared by the evaluation stage (`evaluation.py`), the GEPA arm (`gepa_arm.py`) and the report:

* `arm_summary` / `breakdown`: one rollout job's trajectories -> per-task outcomes (for the
  paired statistics; successes out of `evaluation.trials` per task where an arm plays several), tokens played, and pass rates per required capability (compound tasks
  count once for every capability they need) or per probe (a probe's one capability).
* `trace_budget`: every episode TRACE played before the evaluation, per component, with the
  tokens beside them wherever a job reports them (docs/design.md "Evaluation": a method's budget counts
  every episode it played). Pure over the run's stage records and the artifacts they name, so a
  resumed run accounts exactly what an uninterrupted one does: every count comes from what the
  jobs recorded (trajectories, validation reports, the trainer's running totals), never from how
  many attempts a stage took.

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
A job whose metrics lack rollouts_total (an older trainer) is counted from its config
(max_steps x groups_per_batch x num_generations, plus for gates the warm start its config's
warm_start_labels asks for: warm_start_tasks x (K+1) x warm_start_samples_per_slot replays with
outcome labels, K x warm_start_episodes with provenance labels) and marked "estimated": never silently.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from trace_common.env import Trajectory, loads_jsonl
from trace_common.errors import NotFound
from trace_common.stats import wilson_interval
from tracectl.run.jobs import StageFailed

#: A validation that fails one of these checks stops before the calibration check (validation.py).
STOPS_BEFORE_CALIBRATION = ("extract", "static", "loads", "deterministic", "oracle")


def _finite(v: Any) -> float | None:
    """A metric value as a float, None when absent or not finite (a NaN a stage record kept, or JSON null)."""
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def training_rollouts(metrics: Mapping[str, Any], config: Mapping[str, Any]) -> int:
    """Rollouts a training job spent: reported by the trainer, else derived from its config."""
    reported = _finite(metrics.get("rollouts_total"))
    if reported:
        return int(reported)
    return int(config.get("max_steps", 100) * config.get("groups_per_batch", 4) * config.get("num_generations", 8))


# -- one rollout job's trajectories ----------------------------------------------------------------
def read_trajectories(store, uri: str) -> list[Trajectory]:
    return loads_jsonl(store.get_bytes(store.key_of(uri)), source=uri)


def trajectory_tokens(trajs: Iterable[Trajectory]) -> tuple[int | None, int | None]:
    """(prompt tokens, completion tokens) as the trainer counts them (every assistant turn's full
    prompt, and its completion); None when no turn recorded token ids (an HTTP backend may not)."""
    prompt = completion = 0
    recorded = False
    for tr in trajs:
        for r in tr.turns:
            if r.prompt_token_ids is not None or r.completion_token_ids is not None:
                recorded = True
            prompt += len(r.prompt_token_ids or [])
            completion += len(r.completion_token_ids or [])
    return (prompt, completion) if recorded else (None, None)


def _groups(trajs: Iterable[Trajectory]) -> dict[str, list[bool]]:
    groups: dict[str, list[bool]] = defaultdict(list)
    for tr in trajs:
        if tr.info.get("capability"):              # a probe: its one capability
            keys = [str(tr.info["capability"])]
        elif tr.info.get("capabilities"):          # a compound task: every capability it needs
            keys = [str(c) for c in tr.info["capabilities"]]
        else:
            keys = [str(tr.info.get("task_type") or "all")]
        for k in keys:
            groups[k].append(tr.success)
    return groups


def rates(groups: Mapping[str, list[bool]]) -> dict[str, dict[str, Any]]:
    out = {}
    for key, xs in sorted(groups.items()):
        lo, hi = wilson_interval(sum(xs), len(xs))
        out[key] = {"n": len(xs), "pass_rate": sum(xs) / len(xs), "ci": [lo, hi]}
    return out


def breakdown(store, uri: str) -> dict[str, dict[str, Any]]:
    """Pass rate per required capability (compound tasks: each capability they need; probes: their
    one capability; otherwise the task type), read from the arm's trajectories."""
    return rates(_groups(read_trajectories(store, uri)))


def subgoal_success(store, uri: str) -> dict[str, dict[str, Any]] | None:
    """Per-capability sub-goal success of an arm's compound episodes (`trace_common.domains.store.
    subgoals`): {capability: {"met", "total", "rate"}}, or None when the episodes are not the built-in
    store's, the one target whose verifier attributes each failed sub-request to a capability."""
    trajs = [tr for tr in read_trajectories(store, uri) if not tr.info.get("capability")]  # probes: one skill
    if not trajs or any(tr.env.name != "store" for tr in trajs):
        return None
    from trace_common.domains.store.subgoals import subgoal_rates

    return {c: {"met": met, "total": total, "rate": met / total if total else None}
            for c, (met, total) in subgoal_rates(trajs).items()}


def task_ids_digest(task_ids: Iterable[str]) -> str:
    return hashlib.sha256("\n".join(task_ids).encode()).hexdigest()[:16]


def arm_summary(store, uri: str, trials: int = 1) -> dict[str, Any]:
    """What the evaluation keeps of one arm's trajectories: `breakdown`, the per-task outcomes
    (a string over the tasks sorted by seed, one digit per task: '0'/'1' at one trial, its
    number of successes out of `trials` otherwise, with the digest of that task order, so two
    arms pair only on the same tasks), and the tokens played. Every task must have been played
    exactly `trials` times (the evaluation plays that many); anything else is an error.
    With trials > 1 (tau2's pass^k convention) the pass rate is the mean over tasks, its interval
    a bootstrap over tasks (trials of one task are not independent), and `pass_hat_k` holds
    pass^1 .. pass^trials (trace_common.stats.pass_hat_k)."""
    if not 1 <= trials <= 9:
        raise ValueError(f"trials={trials} must be in [1, 9] (one digit per task in the outcomes string)")
    trajs = sorted(read_trajectories(store, uri), key=lambda tr: (tr.seed, tr.task_id, tr.sample_index))
    by_task: dict[str, list[bool]] = {}
    for tr in trajs:
        by_task.setdefault(tr.task_id, []).append(tr.success)
    wrong = {t: len(xs) for t, xs in by_task.items() if len(xs) != trials}
    if wrong:
        t, k = next(iter(wrong.items()))
        raise StageFailed(f"{uri}: task {t} was played {k} time(s), {len(wrong)} task(s) in all not {trials}: the "
                          f"evaluation pairs {trials} trial(s) per task")
    ids = list(by_task)
    counts = [sum(xs) for xs in by_task.values()]
    prompt, completion = trajectory_tokens(trajs)
    out = {"breakdown": rates(_groups(trajs)), "outcomes": "".join(str(c) for c in counts),
           "task_ids_sha256": task_ids_digest(ids), "prompt_tokens": prompt, "completion_tokens": completion}
    if trials > 1:
        from trace_common.stats import pass_hat_k, task_mean_interval

        out.update(trials=trials, tasks=len(ids), pass_rate=sum(counts) / (trials * len(ids)) if ids else 0.0,
                   ci=list(task_mean_interval(counts, trials)),
                   pass_hat_k={str(k): pass_hat_k(counts, trials, k) for k in range(1, trials + 1)})
    return out


def outcomes(arm: Mapping[str, Any]) -> list[bool]:
    """Per-task pass/fail of a one-trial arm."""
    if arm.get("trials", 1) != 1:
        raise ValueError(f"an arm of {arm['trials']} trials per task has success counts: use trial_successes")
    return [c == "1" for c in arm["outcomes"]]


def trial_successes(arm: Mapping[str, Any]) -> list[int]:
    """Per-task successes out of the arm's `trials` (1 for an arm recorded before trials existed)."""
    return [int(c) for c in arm["outcomes"]]


# -- TRACE's budget ---------------------------------------------------------------------------------
def _component(episodes: int, prompt: float | None, completion: float | None, source: str, **extra) -> dict[str, Any]:
    return {"episodes": int(episodes), "prompt_tokens": None if prompt is None else int(prompt),
            "completion_tokens": None if completion is None else int(completion), "source": source, **extra}


def _sum_tokens(parts: Iterable[Mapping[str, Any]], key: str) -> int | None:
    vals = [p[key] for p in parts]
    return None if any(v is None for v in vals) else int(sum(vals))


def calibration_episodes(report: Mapping[str, Any]) -> dict[str, Any]:
    """Calibration episodes one validation report accounts for (module docstring)."""
    final = 0
    for check in report.get("checks", []):
        if check.get("name") == "calibration":
            final += sum(len(g) for g in (check.get("details") or {}).get("rewards", []))
    cfg = report.get("config") or {}
    per_attempt = int(cfg.get("groups", 16)) * int(cfg.get("group_size", 8))
    earlier = list(report.get("attempts") or [])[:-1]
    exact = sum(int(a["calibration_episodes"]) for a in earlier if a.get("calibration_episodes") is not None)
    unrecorded = [a for a in earlier if a.get("calibration_episodes") is None]
    ran = [a for a in unrecorded
           if not any(str(r).split(":", 1)[0].strip() in STOPS_BEFORE_CALIBRATION for r in a.get("reasons", []))]
    return {"episodes": final + exact + per_attempt * len(ran), "final_attempt": final,
            "earlier_attempts": len(earlier), "earlier_attempt_episodes": exact,
            "earlier_attempt_episodes_bound": per_attempt * len(ran)}


def warm_start_episodes(gates: Mapping[str, Any], k: int) -> int:
    """Episodes the gates job's warm start plays over `k` adapters under the gates config `gates`
    (module docstring): none without warm-start steps; provenance labels play each adapter's
    environment (slot 0's episodes are the rollout stage's, counted there); outcome labels replay
    every task with every slot (the base and each adapter)."""
    if not gates.get("warm_start_steps", 100):
        return 0
    if str(gates.get("warm_start_labels", "outcome")) == "provenance":
        return k * int(gates.get("warm_start_episodes", 16))
    return int(gates.get("warm_start_tasks", 32)) * (k + 1) * int(gates.get("warm_start_samples_per_slot", 1))


def _job_component(metrics: Mapping[str, Any], estimate: int, what: str, **extra) -> dict[str, Any]:
    reported = _finite(metrics.get("rollouts_total"))
    if reported is None:
        return _component(estimate, None, None, f"estimated from the config ({what} reported no rollouts_total)",
                          estimated=True, **extra)
    return _component(int(reported), _finite(metrics.get("prompt_tokens_total")),
                      _finite(metrics.get("completion_tokens_total")), "trainer rollouts_total", **extra)


def trace_budget(store, stages: Mapping[str, Any], grpo: Mapping[str, Any], gates: Mapping[str, Any]) -> dict[str, Any]:
    """Every episode TRACE played before the evaluation (module docstring), from the stage records
    (`Manifest.stages`) and the artifacts they name. `grpo`, `gates`: the run config's
    training.grpo and gates.config (only for jobs that report no totals)."""
    roll = stages["rollout"]
    uri = roll.outputs.get("trajectories")
    if not uri:
        raise StageFailed("the budget needs the rollout stage's trajectories; the rollout stage recorded none")
    trajs = read_trajectories(store, uri)
    prompt, completion = trajectory_tokens(trajs)
    components: dict[str, dict[str, Any]] = {
        "rollout": _component(len(trajs), prompt, completion, "rollout stage trajectories")}

    per_env: dict[str, dict[str, Any]] = {}
    for rec in stages["environments"].result.get("environments", []):
        report_uri = (rec.get("validation_report") or {}).get("uri")
        name = rec.get("capability") or rec.get("name", "?")
        if not report_uri:
            raise StageFailed(f"environment {name!r} has no validation report: its calibration episodes cannot be "
                              "counted (re-run the environments stage)")
        try:
            report = json.loads(store.get_bytes(store.key_of(report_uri)))
        except NotFound:
            raise StageFailed(f"the validation report of environment {name!r} ({report_uri}) is gone: its "
                              "calibration episodes cannot be counted; re-run from the environments stage") from None
        per_env[name] = {**calibration_episodes(report), "status": rec.get("status", "")}
    bound = any(e["earlier_attempt_episodes_bound"] for e in per_env.values())
    components["calibration"] = _component(
        sum(e["episodes"] for e in per_env.values()), None, None,
        "validation reports" + (" (earlier attempts: bound from above)" if bound else ""),
        per_environment=per_env, tokens_note="the environment service reports no tokens for calibration")

    ad = stages["adapters"]
    per_adapter = {cap: _job_component(ad.result.get("metrics", {}).get(cap, {}), training_rollouts({}, grpo),
                                       f"adapter job {cap}") for cap in sorted(ad.outputs)}
    for cap, a in per_adapter.items():   # calibration episodes it trained on: counted under calibration
        reused = _finite(ad.result.get("metrics", {}).get(cap, {}).get("initial_batch_episodes_total"))
        a["trained_calibration_episodes"] = int(reused or 0)
    components["adapters"] = _component(
        sum(a["episodes"] for a in per_adapter.values()), _sum_tokens(per_adapter.values(), "prompt_tokens"),
        _sum_tokens(per_adapter.values(), "completion_tokens"),
        "trainer rollouts_total" if not any(a.get("estimated") for a in per_adapter.values())
        else "trainer rollouts_total, some estimated", per_adapter=per_adapter,
        trained_calibration_episodes=sum(a["trained_calibration_episodes"] for a in per_adapter.values()))

    gm = stages["gates"].result.get("metrics", {})
    labels = str(gates.get("warm_start_labels", "outcome"))
    warm_estimate = warm_start_episodes(gates, len(ad.outputs))
    grpo_estimate = int(gates.get("max_steps", 20)) * int(gates.get("groups_per_batch", 4)) * \
        int(gates.get("num_generations", 8))
    gc = _job_component(gm, warm_estimate + grpo_estimate, "the gates job")
    warm = _finite(gm.get("warm_start_rollouts"))
    warm_n = int(warm) if warm is not None and not gc.get("estimated") else warm_estimate
    gc.update(warm_start_episodes=warm_n, grpo_episodes=gc["episodes"] - warm_n, warm_start_labels=labels)
    components["gates"] = gc

    parts = list(components.values())
    return {"components": components, "total_episodes": sum(c["episodes"] for c in parts),
            "training_episodes": components["adapters"]["episodes"] + gc["episodes"],
            "total_prompt_tokens": sum(c["prompt_tokens"] or 0 for c in parts),
            "total_completion_tokens": sum(c["completion_tokens"] or 0 for c in parts),
            "tokens_missing": [k for k, c in components.items() if c["prompt_tokens"] is None]}
