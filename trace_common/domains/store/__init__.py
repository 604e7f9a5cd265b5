"""`store`: the built-in tau2-style customer-service domain (registered as store@1.0.0).

Modules: `world` (seeded database), `tools` (schemas, checks, effects), `tasks` (task
types and procedural generation), `user` (scripted user), `verifier` (reward),
`env` (the Environment), `expert` (scripted expert with planted partial gaps),
`policy.md` (the written policy, used as the system prompt).
"""

from trace_common.domains.store.env import SPLITS, StoreEnv, load_policy
from trace_common.domains.store.expert import DEFAULT_SKILLS, ExpertConfig, StoreExpert
from trace_common.domains.store.tasks import CAPABILITIES, CAPABILITY_OF, TASK_TYPES, Task, generate_task
from trace_common.env.registry import register

register(StoreEnv.name, StoreEnv.version, StoreEnv, description=StoreEnv.description,
         params={"task_types": "comma-separated subset of " + ", ".join(TASK_TYPES) + " (default: all)"})

__all__ = ["CAPABILITIES", "CAPABILITY_OF", "DEFAULT_SKILLS", "SPLITS", "TASK_TYPES", "ExpertConfig",
           "StoreEnv", "StoreExpert", "Task", "generate_task", "load_policy"]
