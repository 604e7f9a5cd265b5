"""The cluster config as the rehearsal runs it: the same sections, arms and modes, with every
address, path and model name moved to its stand-in and every budget cut to what a 135M model on two
CPU cores plays in minutes. Each change is listed (`TINY`, and the stand-ins) so a reader of the
rehearsal's output sees exactly what differed from the cluster run.
"""

from __future__ import annotations

import copy
from typing import Any

from tracectl.rehearsal.local import SERVED_NAME, StandIns

#: (dotted field, rehearsal value, why). Budgets only: the arms, modes and mechanisms stay the config's.
TINY: tuple[tuple[str, Any, str], ...] = (
    ("rollout.limit", 2, "two tau2 training tasks"),
    ("rollout.samples", 2, "two episodes each (TRACE's budget, 4, then pays for one GEPA proposal)"),
    ("rollout.concurrency", 2, "two episodes in flight"),
    ("target.params.max_steps", "4", "tau2 steps per episode (user, agent and tool messages after the agent's "
     "greeting): two agent turns"),
    ("target.params.user_max_tokens", "48", "one simulated user reply (a 135M model rarely stops on its own)"),
    ("max_completion_length", {"tokens": 48, "reason": "rehearsal on SmolLM2-135M: 48 tokens per agent turn keeps "
                               "tau2's ~6k-token prompt plus the conversation inside its 8k context"}, "one agent turn"),
    ("analysis.num_runs", 1, "one labelling run"),
    ("analysis.min_passing_runs", 1, "of one"),
    ("analysis.max_capabilities", 1, "at most one capability goes on to generation"),
    ("environments.max_retries", 0, "no feedback rounds"),
    ("training.executor", "local", "training Jobs as the trainer's local subprocesses (no Kubernetes API here)"),
    ("training.parallel", 1, "one job at a time"),
    ("training.grpo.max_steps", 1, "one GRPO iteration"),
    ("training.grpo.groups_per_batch", 1, "of one group"),
    ("training.grpo.num_generations", 4, "of four episodes (GRPO on the target: TRACE's 4 in one iteration)"),
    ("training.grpo.max_resample_rounds", 0, "no re-collection"),
    ("training.grpo.vllm.request_timeout_s", 600.0, "vLLM-CPU prefills tau2's ~6k-token prompt through a new "
     "adapter version in more than the default 30 s"),
    ("gates.config.max_steps", 1, "one gate iteration"),
    ("gates.config.groups_per_batch", 1, "of one group"),
    ("gates.config.num_generations", 2, "of two episodes"),
    ("evaluation.limit", 2, "two test tasks"),
    ("evaluation.trials", 2, "two trials each (pass^k with k = 2)"),
    ("evaluation.grpo_budgets", [1.0], "GRPO on the target at TRACE's budget only"),
    ("evaluation.parallel", 1, "one arm at a time"),
    ("evaluation.gepa_search", {"val_size": 1, "minibatch_size": 1}, "GEPA: one validation task, one-task minibatches"),
    ("analysis.on_no_capability", "baselines", "a 135M analyst finds no capability: go on to the baselines, saying so"),
)


def _set(cfg: dict[str, Any], dotted: str, value: Any) -> Any:
    *parents, leaf = dotted.split(".")
    node = cfg
    for key in parents:
        node = node.setdefault(key, {})
    before = node.get(leaf)
    node[leaf] = copy.deepcopy(value)
    return before


def _walk(value: Any, fn) -> Any:
    if isinstance(value, dict):
        return {k: _walk(v, fn) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, fn) for v in value]
    return fn(value) if isinstance(value, str) else value


def rehearsal_config(cluster: dict[str, Any], s: StandIns, *, run_id: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """(the rehearsal's run config, the changes made, one line each) from the cluster run config."""
    cfg = _walk(copy.deepcopy(cluster), s.rewrite)
    changes = [f"every address and path of the config moved to its stand-in ({len(s.addresses)} addresses)"]
    models = sorted({m for m in _models(cluster) if m})
    for path in _model_fields(cfg):
        _set(cfg, path, SERVED_NAME)
    changes.append(f"model names {', '.join(models) or '(none)'} -> {SERVED_NAME!r} (base agent, user simulator, "
                   "analyst, generator, GEPA)")
    new_id = run_id or f"rehearsal-{cluster.get('run_id', 'run')}"[:64]
    changes.append(f"run_id {cluster.get('run_id')!r} -> {new_id!r}")
    cfg["run_id"] = new_id
    for dotted, value, why in TINY:
        before = _set(cfg, dotted, value)
        changes.append(f"{dotted}: {before!r} -> {value!r} ({why})")
    return cfg, changes


def _model_fields(cfg: dict[str, Any]) -> list[str]:
    """Dotted paths of every model name in a run config."""
    out = []
    if "base_agent" in cfg:
        out.append("base_agent.name")
    for section in ("target.user_simulator", "analysis.llm", "environments.llm", "evaluation.gepa"):
        node = cfg
        for key in section.split("."):
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and "model" in node:
            out.append(f"{section}.model")
    return out


def _models(cfg: dict[str, Any]) -> list[str]:
    found = []
    for path in _model_fields(cfg):
        node: Any = cfg
        for key in path.split("."):
            node = node[key]
        found.append(node)
    return found
