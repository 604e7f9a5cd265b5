"""What one evaluation arm spent and scored, read back from its artifacts.

Shared by the evaluation stage (`evaluation.py`) and the GEPA arm (`gepa_arm.py`), which both
turn a rollout job's trajectories into an arm's record.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from trace_common.env import loads_jsonl
from trace_common.stats import wilson_interval


def training_rollouts(metrics: dict[str, float], config: dict[str, Any]) -> int:
    """Rollouts a training job spent: reported by the trainer, else derived from its config."""
    if metrics.get("rollouts_total"):
        return int(metrics["rollouts_total"])
    return int(config.get("max_steps", 100) * config.get("groups_per_batch", 4) * config.get("num_generations", 8))


def breakdown(store, uri: str) -> dict[str, dict[str, float]]:
    """Pass rate per capability/task type, read from the arm's trajectories."""
    groups: dict[str, list[bool]] = defaultdict(list)
    for tr in loads_jsonl(store.get_bytes(store.key_of(uri))):
        cap = tr.info.get("capability") or tr.info.get("task_type") or "all"
        groups[str(cap)].append(tr.success)
    out = {}
    for cap, xs in sorted(groups.items()):
        lo, hi = wilson_interval(sum(xs), len(xs))
        out[cap] = {"n": len(xs), "pass_rate": sum(xs) / len(xs), "ci": [lo, hi]}
    return out
