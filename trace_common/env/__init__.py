"""Environment SDK: the Environment contract, OpenAI-format messages and actions, the
Trajectory record, the registry of environments, and the episode loop.

    from trace_common.env import make, run_episode
    env = make("store")
    traj = run_episode(env, policy_fn, seed=100_000)

Contract details live in the docstrings of `Environment` (what an implementation must
fulfil), `Trajectory` (what a stored episode holds) and `Registry`.
"""

from trace_common.env.environment import Diagnostic, Environment, Observation, StepResult, Termination
from trace_common.env.episode import AsyncPolicyFn, PolicyFn, PolicyTurn, run_episode, run_episode_async
from trace_common.env.messages import (
    Action,
    FunctionCall,
    Message,
    MessageAction,
    ToolAction,
    ToolCall,
    action_from_dict,
    actions_from_message,
    messages_from_dicts,
    messages_to_dicts,
    tool_action_from_call,
)
from trace_common.env.registry import (
    EnvSpec,
    Registry,
    default_registry,
    get_spec,
    list_environments,
    make,
    register,
)
from trace_common.env.trajectory import (
    EnvInfo,
    PolicyInfo,
    Trajectory,
    TurnRecord,
    dumps_jsonl,
    loads_jsonl,
    read_jsonl,
    to_json_line_bytes,
    write_jsonl,
)

__all__ = [
    "Action", "Diagnostic", "EnvInfo", "EnvSpec", "Environment", "FunctionCall", "Message",
    "MessageAction", "Observation", "PolicyFn", "PolicyInfo", "PolicyTurn", "Registry", "StepResult",
    "Termination", "ToolAction", "ToolCall", "Trajectory", "TurnRecord", "action_from_dict",
    "actions_from_message", "default_registry", "dumps_jsonl", "to_json_line_bytes", "get_spec", "list_environments",
    "loads_jsonl", "make", "messages_from_dicts", "messages_to_dicts", "read_jsonl", "register",
    "run_episode", "run_episode_async", "AsyncPolicyFn", "tool_action_from_call", "write_jsonl",
]
