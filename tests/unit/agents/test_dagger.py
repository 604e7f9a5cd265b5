"""Imitation on the learner's states (`trace_common.agents.dagger`): what counts as the same decision,
where a learner first departs from its teacher, which skill draw explains it, the recovery episode
(the learner's turns replayed, then the teacher's) and its loss mask (the teacher's turns only)."""

from __future__ import annotations

import random

import pytest

from trace_common.agents import shipped
from trace_common.agents.dagger import (
    FROM_TURN,
    explaining_flags,
    first_departure,
    recovery_episode,
    recovery_episodes,
    recovery_examples,
    same_message,
)
from trace_common.domains.store import CAPABILITIES, ExpertConfig, StoreEnv, StoreExpert
from trace_common.env.episode import run_episode
from trace_common.env.messages import FunctionCall, Message, ToolCall
from trace_common.errors import FailedPrecondition, InvalidArgument

HALF = ExpertConfig(skills=dict.fromkeys(CAPABILITIES, 0.5))


def _call(name: str, arguments: str, call_id: str = "a") -> Message:
    return Message.assistant(None, [ToolCall(id=call_id, function=FunctionCall(name=name, arguments=arguments))])


@pytest.mark.parametrize("a, b, same", [
    (_call("get_order_details", '{"order_id": "#W1"}', "a"), _call("get_order_details", '{"order_id":"#W1"}', "b"),
     True),
    (_call("f", '{"x": 1, "y": 2}'), _call("f", '{"y": 2, "x": 1}'), True),
    (_call("f", '{"x": 1}'), _call("f", '{"x": 2}'), False),
    (_call("f", '{"x": 1}'), _call("g", '{"x": 1}'), False),
    (_call("f", '{x: 1'), _call("f", '{"x": 1}'), False),
    (Message.assistant("Done. "), Message.assistant("Done."), True),
    (Message.assistant("Done."), Message.assistant("Order #W1 is cancelled."), False),
    (Message.assistant("Done."), _call("f", "{}"), False),
], ids=["ids-ignored", "key-order", "other-value", "other-tool", "unparsable", "text-space", "other-text",
        "text-vs-call"])
def test_same_message(a, b, same):
    assert same_message(a, b) is same
    assert same_message(b, a) is same


def _played(expert: StoreExpert, env: StoreEnv, seed: int, flags, mistake_at: int | None = None):
    env.reset(seed)
    task = env.task

    def policy(history, tools):
        n = sum(1 for m in history if m.role == "assistant")
        if n == mistake_at:
            return _call("get_order_details", '{"order_id": "#W0000000"}')
        return expert.next_message(task, flags, history)

    return task, run_episode(env, policy, seed)


def test_the_teacher_departs_nowhere_and_a_mistake_is_found_where_it_is():
    env, expert = StoreEnv(), StoreExpert(HALF)
    for seed in range(40):
        flags = expert.skill_flags(seed)
        task, own = _played(expert, env, seed, flags)
        assert first_departure(expert, task, flags, own.messages) is None
        _, erring = _played(expert, env, seed, flags, mistake_at=2)
        assert first_departure(expert, task, flags, erring.messages) == 2


def test_a_learner_showing_another_skill_draw_is_explained_not_called_wrong():
    """Episodes the teacher plays with a draw other than the episode's own: the explaining draw
    follows them to the end (no departure), and it is the episode's draw where that does too."""
    env, expert = StoreEnv(), StoreExpert(HALF)
    moved = 0
    for seed in range(60):
        drawn = expert.skill_flags(seed)
        other = {c: random.Random(f"{seed}:{c}").random() < 0.5 for c in CAPABILITIES}
        task, traj = _played(expert, env, seed, other)
        flags, d = explaining_flags(expert, task, drawn, traj.messages)
        assert d is None, seed
        assert first_departure(expert, task, flags, traj.messages) is None
        if first_departure(expert, task, drawn, traj.messages) is None:
            assert flags == drawn
        else:
            moved += 1
    assert moved >= 10  # the table has cases where the episode's own draw does not explain it


def test_recovery_episode_replays_the_learner_then_follows_the_teacher():
    env, expert = StoreEnv(), StoreExpert(ExpertConfig.perfect())
    learners = [_played(expert, env, seed, expert.skill_flags(seed), mistake_at=1)[1] for seed in range(30)]
    episodes = recovery_episodes(expert, learners)
    assert len(episodes) == len(learners)
    for learner, rec in zip(learners, episodes, strict=True):
        k = rec.info[FROM_TURN]
        assert rec.info["first_departure"] == 1 and 1 <= k
        ours = [m for m in rec.messages if m.role == "assistant"]
        theirs = [m for m in learner.messages if m.role == "assistant"]
        assert [m.model_dump() for m in ours[:k]] == [m.model_dump() for m in theirs[:k]]
        assert rec.success  # the skilled teacher recovers from an unknown-id lookup


def test_a_learner_that_is_its_teacher_gives_no_recovery_episode():
    env, expert = StoreEnv(), StoreExpert(HALF)
    assert all(recovery_episode(env, expert, expert.play(env, seed), random.Random(0)) is None for seed in range(20))


def test_only_draws_the_teacher_can_make_explain_an_episode():
    """Episodes played without the multi-step skill: a teacher that always has it (probability 1)
    cannot explain them, so they depart; one that has it half the time explains them."""
    env = StoreEnv()
    unskilled = StoreExpert(ExpertConfig(skills={c: float(c != "multi_step_task_completion") for c in CAPABILITIES}))
    always, half = StoreExpert(ExpertConfig.perfect()), StoreExpert(HALF)
    departed = 0
    for seed in range(40):
        flags = unskilled.skill_flags(seed)
        task, traj = _played(unskilled, env, seed, flags)
        assert explaining_flags(half, task, flags, traj.messages)[1] is None
        chosen, d = explaining_flags(always, task, always.skill_flags(seed), traj.messages)
        assert all(chosen.values())  # the only draw of a perfect teacher
        departed += d is not None
    assert departed >= 10  # the table holds tasks with several requests stated at once


def test_a_replay_that_does_not_reach_the_learners_states_is_refused():
    env, expert = StoreEnv(), StoreExpert(ExpertConfig.perfect())
    _, learner = _played(expert, env, 7, expert.skill_flags(7), mistake_at=1)
    tampered = learner.model_copy(deep=True)
    tool = next(m for m in tampered.messages if m.role == "tool")
    tool.content = "TAMPERED"
    assert recovery_episode(env, expert, learner, random.Random(0)) is not None
    with pytest.raises(FailedPrecondition, match="did not reach the state"):
        recovery_episode(env, expert, tampered, random.Random(0))


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(shipped.shipped_dir("micro"))


def test_recovery_examples_train_only_on_the_teacher_turns(tokenizer):
    from trace_common.policy.chat import ChatFormat

    env, expert = StoreEnv(), StoreExpert(ExpertConfig.perfect())
    learners = [_played(expert, env, seed, expert.skill_flags(seed), mistake_at=1)[1] for seed in range(6)]
    episodes = recovery_episodes(expert, learners)
    examples = recovery_examples(tokenizer, episodes)
    assert len(examples) == len(episodes)
    chat = ChatFormat(tokenizer)
    for rec, ex in zip(episodes, examples, strict=True):
        text, spans = chat.assistant_spans(rec.messages, rec.tools)
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        first = spans[rec.info[FROM_TURN]][0]
        targets = [off for off, m in zip(enc["offset_mapping"], ex.loss_mask, strict=True) if m]
        assert targets and min(s for s, _ in targets) >= first  # nothing before the first imitated turn
        taught = "".join(text[s:e] for s, e in targets)
        later = [m for m in rec.messages if m.role == "assistant"][rec.info[FROM_TURN]:]
        for m in later:  # every imitated turn's text is a target
            for part in ([m.content] if m.content else []) + [c.name for c in m.tool_calls or []]:
                assert part in taught


def test_recovery_examples_refuse_an_episode_without_its_first_turn(tokenizer):
    traj = StoreExpert(HALF).play(StoreEnv(), 1)
    with pytest.raises(InvalidArgument, match=FROM_TURN):
        recovery_examples(tokenizer, [traj])
