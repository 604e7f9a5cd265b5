"""`store`: the built-in tau2-style customer-service domain (registered as store@2.0.0).

Modules: `world` (seeded database), `tools` (schemas, checks, effects), `task_model` (task
data model, traits), `compound` (the compound target's generator), `tasks` (probe task
types, `generate_task`), `user` (scripted user), `verifier` (all-or-nothing reward),
`attribution` (which capability each failed sub-goal belongs to), `env` (the Environment,
its splits), `expert` (scripted expert with planted partial gaps), `policy.md` (the
written policy, used as the system prompt).
"""

from trace_common.domains.store.env import SPLITS, StoreEnv, load_policy, parse_task_types
from trace_common.domains.store.expert import DEFAULT_SKILLS, ExpertConfig, StoreExpert
from trace_common.domains.store.tasks import (
    CAPABILITIES,
    CAPABILITY_OF,
    COMPOUND,
    DEFAULT_TASK_TYPES,
    PROBE_TYPES,
    TASK_TYPES,
    Task,
    generate_task,
)
from trace_common.env.registry import register

register(StoreEnv.name, StoreEnv.version, StoreEnv, description=StoreEnv.description,
         params={"task_types": "comma-separated: 'compound' (default, the target), 'probes' (all four probe "
                               "types) or a subset of " + ", ".join(PROBE_TYPES)})

__all__ = ["CAPABILITIES", "CAPABILITY_OF", "COMPOUND", "DEFAULT_SKILLS", "DEFAULT_TASK_TYPES", "PROBE_TYPES",
           "SPLITS", "TASK_TYPES", "ExpertConfig", "StoreEnv", "StoreExpert", "Task", "generate_task", "load_policy",
           "parse_task_types"]
