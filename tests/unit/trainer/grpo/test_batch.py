"""From episodes to training tensors: turn merging, masks, weights, micro-batches."""

from __future__ import annotations

import pytest
import torch

from services.trainer.grpo.batch import (
    TrainEpisode,
    TurnTokens,
    build_sequences,
    collate,
    episode_turns,
    micro_batches,
    token_weights,
)
from trace_common.env import EnvInfo, Message, PolicyInfo, Termination, Trajectory, TurnRecord
from trace_common.env.guidance import guidance_block
from trace_common.errors import FailedPrecondition


def ep(turns, adv=1.0, guided=False):
    return TrainEpisode(group=0, index=0, seed=0, reward=1.0, advantage=adv, guided=guided,
                        turns=[TurnTokens(p, c, [-0.5] * len(c)) for p, c in turns])


@pytest.mark.parametrize("turns, expected", [
    # one turn: prompt + completion, targets on the completion
    ([([1, 2], [3, 4])], [([1, 2, 3, 4], [0, 0, 1, 1])]),
    # the second prompt extends the first sequence: merged into one
    ([([1, 2], [3]), ([1, 2, 3, 7, 8], [9])], [([1, 2, 3, 7, 8, 9], [0, 0, 1, 0, 0, 1])]),
    # re-tokenised differently (no prefix): a new sequence, each turn scored in its own context
    ([([1, 2], [3]), ([1, 5, 7], [9])], [([1, 2, 3], [0, 0, 1]), ([1, 5, 7, 9], [0, 0, 0, 1])]),
    # an empty completion contributes nothing
    ([([1, 2], []), ([1, 2, 6], [4])], [([1, 2, 6, 4], [0, 0, 0, 1])]),
])
def test_turn_merging(turns, expected):
    seqs = build_sequences([ep(turns)])
    assert [(s.input_ids, [int(t) for t in s.target]) for s in seqs] == expected


def test_completion_without_prompt_is_refused():
    with pytest.raises(FailedPrecondition, match="position 0"):
        build_sequences([ep([([], [1, 2])])])


@pytest.mark.parametrize("loss_type, in_loss, expected", [
    # dapo: 1 / all trained tokens (3 + 1)
    ("dapo", [True, True], [0.25, 0.25]),
    # grpo: 1 / (episode tokens * episodes)
    ("grpo", [True, True], [1 / 6, 1 / 2]),
    # an excluded (guided) episode: no weight, and not counted
    ("dapo", [True, False], [1 / 3, 0.0]),
    ("grpo", [False, True], [0.0, 1.0]),
])
def test_token_weights(loss_type, in_loss, expected):
    eps = [ep([([1], [2, 3, 4])]), ep([([1], [5])])]
    seqs = build_sequences(eps)
    assert token_weights(eps, seqs, in_loss, loss_type) == pytest.approx(expected)


def test_collate_masks_and_selected_order():
    eps = [ep([([1, 2], [3, 4])], adv=2.0), ep([([1], [5])], adv=-1.0, guided=True)]
    seqs = build_sequences(eps)
    mb = collate(eps, seqs, [0, 1], [0.25, 0.5], [True, True], pad_id=0)
    assert mb.input_ids.tolist() == [[1, 2, 3, 4], [1, 5, 0, 0]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert mb.selected(mb.advantage).tolist() == [2.0, 2.0, -1.0]
    assert mb.selected(mb.guided).tolist() == [False, False, True]
    assert mb.selected(mb.weight).tolist() == [0.25, 0.25, 0.5]
    assert mb.selected(mb.input_ids).tolist() == [3, 4, 5]
    excluded = collate(eps, seqs, [0, 1], [0.25, 0.5], [True, False], pad_id=0)
    assert excluded.selected(excluded.input_ids).tolist() == [3, 4]


@pytest.mark.parametrize("lengths, chunks, expected", [
    ([3, 9, 5, 7], 2, [[1, 3], [2, 0]]),
    ([3, 9, 5], 1, [[1, 2, 0]]),
    ([3, 9], 5, [[1], [0]]),
])
def test_micro_batches(lengths, chunks, expected):
    seqs = build_sequences([ep([(list(range(1, n)), [1])]) for n in lengths])
    assert micro_batches(seqs, chunks) == expected


def test_collate_dtypes():
    eps = [ep([([1, 2], [3])])]
    mb = collate(eps, build_sequences(eps), [0], [1.0], [True], pad_id=9)
    assert mb.input_ids.dtype == torch.long and mb.target_mask.dtype == torch.bool


BLOCK = guidance_block("1. lookup {\"key\": \"k\"}")


def _traj(messages):
    return Trajectory(task_id="t", seed=0, env=EnvInfo(name="e", version="1"), policy=PolicyInfo(model="m"),
                      messages=messages, reward=0.0, success=False, termination=Termination.DONE,
                      turns=[TurnRecord(message_index=len(messages) - 1, prompt_token_ids=[1, 2],
                                        completion_token_ids=[3], logprobs=[-0.1])])


@pytest.mark.parametrize("messages, refused", [
    ([Message.system("S"), Message.user("U"), Message.assistant("A")], False),
    # the environment's own messages hold the block: the plain prompt would show the guidance
    ([Message.system(f"S\n\n{BLOCK}"), Message.user("U"), Message.assistant("A")], True),
    ([Message.system("S"), Message.user(f"U {BLOCK}"), Message.assistant("A")], True),
    # the policy's own reply may quote the tag: what it sampled is what it is trained on
    ([Message.system("S"), Message.user("U"), Message.assistant(f"A {BLOCK}")], False),
])
@pytest.mark.parametrize("guided", [False, True])
def test_a_conversation_holding_the_block_is_refused(messages, refused, guided):
    render = lambda msgs, tools: [9, 9]  # noqa: E731 - a guided episode's prompt is re-rendered
    if refused:
        with pytest.raises(FailedPrecondition, match="<expert_guidance> block"):
            episode_turns(_traj(messages), guided=guided, render=render)
    else:
        (turn,) = episode_turns(_traj(messages), guided=guided, render=render)
        assert turn.prompt_ids == ([9, 9] if guided else [1, 2]) and turn.completion_ids == [3]
