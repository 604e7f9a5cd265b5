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


@pytest.mark.parametrize(("kw", "cap", "fragment"), [
    ({"tasks": {"split": "test", "limit": 10}, "samples_per_task": 3}, 30, None),  # at the cap
    ({"tasks": {"split": "test", "limit": 10}, "samples_per_task": 3}, 29,
     "spec.tasks.limit x spec.samples_per_task: expected at most 29 episodes per job"),
    ({"tasks": {"task_ids": [str(i) for i in range(10_000)]}, "samples_per_task": 1024}, 100_000,
     "spec.tasks.task_ids x spec.samples_per_task: expected at most 100000 episodes per job (the operator's "
     "TRACE_ROLLOUT_MAX_EPISODES_PER_JOB), got 10240000; 10000 tasks x 1024 samples each"),
    ({"tasks": {"split": "train", "limit": 100_000}, "samples_per_task": 2}, 100_000,
     "spec.tasks.limit x spec.samples_per_task"),
    ({"tasks": {"split": "dev"}}, 299, "spec.tasks.split x spec.samples_per_task"),  # the whole split (300)
], ids=["at-cap", "limit-past-cap", "10k-ids-x-1024", "train-100k-x-2", "whole-split"])
def test_plan_caps_the_episodes_of_a_job(kw, cap, fragment):
    if fragment is None:
        assert runner.plan(_spec(**kw), max_episodes=cap).episodes == cap
        return
    with pytest.raises(errors.InvalidArgument) as err:
        runner.plan(_spec(**kw), max_episodes=cap)
    assert fragment in str(err.value) and "Split the tasks over several jobs" in str(err.value), str(err.value)


def test_the_episode_cap_is_an_operator_setting(monkeypatch):
    from services.rollout.settings import RolloutSettings

    assert RolloutSettings().max_episodes_per_job == 100_000  # generous: the demo's largest job is 500 episodes
    monkeypatch.setenv(runner.MAX_EPISODES_SETTING, "64")
    assert RolloutSettings().max_episodes_per_job == 64


def _tau2_spec(task_ids: list[str]) -> RolloutSpecModel:
    from tests.support.tau2_data import require_tau2_data

    retail = (require_tau2_data() / "retail").resolve()
    return _spec(environment={"name": "tau2-retail", "uri": retail.as_uri()},  # plan loads no model
                 policy={"backend": "POLICY_BACKEND_IN_PROCESS", "model": "micro"}, tasks={"task_ids": task_ids})


@pytest.mark.parametrize(("task_ids", "past"), [
    (["0", "113"], None),               # tau2 retail has 114 tasks: seeds 0..113
    (["114"], [114]),
    (["5", "1000", "114", "7"], [1000, 114]),
])
def test_plan_refuses_tau2_task_ids_past_its_task_list(task_ids, past):
    from tests.support.tau2_data import require_tau2_data

    roots = [require_tau2_data()]
    if past is None:
        assert runner.plan(_tau2_spec(task_ids), data_roots=roots).seeds == [int(i) for i in task_ids]
        return
    with pytest.raises(errors.InvalidArgument) as err:
        runner.plan(_tau2_spec(task_ids), data_roots=roots)
    assert str(err.value).startswith("spec.tasks.task_ids: expected task seeds of 'tau2-retail': 0 to 113 "
                                     f"(the index of one of its 114 tasks), got {past}"), str(err.value)


def test_a_procedural_environment_takes_any_seed():
    assert runner.plan(_spec(tasks={"task_ids": ["999999999"]})).seeds == [999_999_999]
