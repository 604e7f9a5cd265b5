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
A job whose metrics lack rollouts_total (an older trainer) is counted from its config
(max_steps x groups_per_batch x num_generations, plus for gates the warm start its config's
warm_start_labels asks for: warm_start_tasks x (K+1) x warm_start_samples_per_slot replays with
outcome labels, K x warm_start_episodes with provenance labels) and marked "estimated": never silently.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from trace_common.errors import NotFound
from tracectl.evaluation.scoring import read_trajectories, trajectory_tokens
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
