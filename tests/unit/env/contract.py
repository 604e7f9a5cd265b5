"""Reusable checks of the `Environment` contract (trace_common.env.environment).

Any environment's tests can call `check_environment_contract(make_env, seeds)`; it
asserts the promises of the Environment docstring that hold for every environment:
determinism per seed, distinct instances for distinct seeds, OpenAI tool schemas, error
observations for agent mistakes without state change, reward range, diagnostic shape,
disjoint splits, and FailedPrecondition on misuse.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import pytest

from trace_common.env import Diagnostic, Environment, MessageAction, ToolAction
from trace_common.errors import FailedPrecondition


def _obs_json(env: Environment, seed: int) -> str:
    obs = env.reset(seed)
    return json.dumps({"messages": [m.to_dict() for m in obs.messages], "task_id": obs.task_id,
                       "tools": obs.tools, "info": obs.info}, sort_keys=True)


def check_environment_contract(make_env: Callable[[], Environment], seeds: Sequence[int], *,
                               ends_on_user_messages: bool = True) -> None:
    """`ends_on_user_messages`: the env ends an episode within 4 x default_max_turns agent
    messages (true for scripted users); then stepping after the end must raise."""
    assert len(seeds) >= 2, "give at least two seeds"
    env_a, env_b = make_env(), make_env()
    assert isinstance(env_a.name, str) and env_a.name and isinstance(env_a.version, str) and env_a.version

    # determinism: same seed -> identical observation, across instances and re-resets
    for seed in seeds:
        first = _obs_json(env_a, seed)
        assert first == _obs_json(env_b, seed), f"seed {seed}: two instances differ"
        assert first == _obs_json(env_a, seed), f"seed {seed}: reset twice differs"
    assert len({_obs_json(env_a, s) for s in seeds}) == len(seeds), "distinct seeds gave identical instances"

    # tool schemas: OpenAI function format, identical for every seed
    schemas = env_a.tool_schemas()
    assert schemas, "no tools"
    for schema in schemas:
        assert schema["type"] == "function"
        fn = schema["function"]
        assert isinstance(fn["name"], str) and fn["name"]
        assert fn["parameters"]["type"] == "object"
    env_a.reset(seeds[1])
    assert env_a.tool_schemas() == schemas

    # agent mistakes -> one error tool observation, episode continues
    obs = env_a.reset(seeds[0])
    assert obs.messages[0].role == "system" and obs.messages[-1].role == "user"
    for bad in (ToolAction(name="no_such_tool_xyz", arguments={}, call_id="c1"),
                ToolAction(name=schemas[0]["function"]["name"], call_id="c2", raw_arguments="{oops",
                           error="arguments are not valid JSON")):
        result = env_a.step(bad)
        assert [m.role for m in result.observation] == ["tool"]
        assert result.observation[0].tool_call_id == bad.call_id
        assert not result.done and not env_a.done
    reward = env_a.reward()
    assert 0.0 <= reward <= 1.0
    for event in env_a.diagnostics():
        Diagnostic.model_validate(event)

    # splits are disjoint
    splits = {name: set(seeds_) for name, seeds_ in env_a.splits().items()}
    names = sorted(splits)
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            assert not splits[x] & splits[y], f"splits {x} and {y} overlap"

    # misuse: stepping a finished episode
    env_c = make_env()
    env_c.reset(seeds[0])
    for _ in range(env_c.default_max_turns * 4):
        if env_c.done:
            break
        env_c.step(MessageAction(content="Done."))
    assert isinstance(env_c.task_id, str)
    if ends_on_user_messages:
        assert env_c.done, "the episode never ended on agent messages"
        with pytest.raises(FailedPrecondition):
            env_c.step(MessageAction(content="again"))
