"""Rollout runner pieces that need no service: system-prompt override, sampling seeds, planning."""

import asyncio

import pytest

from services.rollout import runner
from services.rollout.specs import RolloutSpecModel
from trace_common import errors
from trace_common.env import Message


def test_system_prompt_override_reaches_the_policy_only():
    seen = []

    async def policy(messages, tools):
        seen.append([m.content for m in messages])
        return Message.assistant("ok")

    wrapped = runner.with_system_prompt(policy, "OPTIMISED PROMPT")
    history = [Message.system("original"), Message.user("hi")]
    asyncio.run(wrapped(history, []))
    assert seen == [["OPTIMISED PROMPT", "hi"]]
    assert history[0].content == "original"  # the episode's own record is untouched


def test_sampling_seeds_are_stable_and_distinct():
    seeds = {(t, k): runner.sampling_seed(7, t, k) for t in range(50) for k in range(4)}
    assert len(set(seeds.values())) == 200
    assert runner.sampling_seed(7, 3, 1) == seeds[(3, 1)]


def _spec(**kw):
    base = {"environment": {"name": "store"}, "policy": {"backend": "POLICY_BACKEND_SCRIPTED", "model": "expert"}}
    base.update(kw)
    return RolloutSpecModel.model_validate(base)


@pytest.mark.parametrize(("kw", "episodes"), [
    ({"tasks": {"split": "test", "limit": 10}, "samples_per_task": 3}, 30),
    ({"tasks": {"task_ids": ["5", "9"]}}, 2),
    ({"tasks": {"split": "dev"}}, 300),
])
def test_plan_resolves_tasks(kw, episodes):
    assert runner.plan(_spec(**kw)).episodes == episodes


@pytest.mark.parametrize(("kw", "exc"), [
    ({"tasks": {"split": "nope"}}, errors.NotFound),
    ({"tasks": {"task_ids": ["-1"]}}, errors.InvalidArgument),
    ({"tasks": {"split": "train"}}, errors.InvalidArgument),  # 100k tasks without a limit
    ({"environment": {"name": "store", "params": {"bogus": "1"}}}, errors.InvalidArgument),
])
def test_plan_rejects(kw, exc):
    with pytest.raises(exc):
        runner.plan(_spec(**kw))
