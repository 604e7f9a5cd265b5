"""Imitation on the learner's own states (DAgger, Ross et al. 2011), for the store's base agents.

A base agent warm-started only on its teacher's episodes sees, once it errs, states its teacher
never visits, and nothing taught it what to do there, so one error can end an episode. Here the
learner (an agent's model) plays train tasks; the scripted teacher labels the states it reached;
training on those labels teaches it to go on from its own mistakes the way its teacher would.

Semantics (one learner episode x, of task t, `StoreExpert.next_message` as the label):
    flags  = the teacher's skill draw that follows x longest before x departs from its label
             (`explaining_flags`: among the draws the teacher can make -- a skill of probability 0
             never shown, one of probability 1 always -- the latest first departure; ties go to
             the draw with most flags equal to the episode's own draw), so that where the
             learner merely showed a skill less often than the teacher, that is not called an error
             (and not taught either: an episode the teacher could have played is skipped)
    d      = x's first turn whose message differs from the teacher's label (None: x is the teacher's)
    k      ~ uniform over [d, turns(x) - 1]                       (seeded by seed, sample index)
    recovery episode = replay x's first k assistant messages, then the teacher, with `flags`,
                       to the end; `info["imitate_from_turn"] = k`
    loss   = on the recovery episode's assistant turns from k on (`recovery_examples`)
k = d is the teacher's own decision at the state where the learner first departs; k > d are
states only the learner's error leads to. Episodes the learner plays as its teacher would teach
nothing new and are skipped.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from typing import Any

from trace_common.domains.store import CAPABILITIES, StoreEnv, StoreExpert
from trace_common.domains.store.expert import call_key
from trace_common.domains.store.task_model import Task
from trace_common.env.episode import run_episode
from trace_common.env.messages import Message
from trace_common.env.trajectory import PolicyInfo, Trajectory
from trace_common.errors import FailedPrecondition, InvalidArgument
from trace_common.policy.chat import ChatFormat

FROM_TURN = "imitate_from_turn"


def same_message(a: Message, b: Message) -> bool:
    """Whether two assistant messages are the same decision: the same calls (name and parsed
    arguments, ids ignored), or, without calls, the same text."""
    calls_a = [call_key(c.name, c.function.arguments) for c in a.tool_calls or []]
    calls_b = [call_key(c.name, c.function.arguments) for c in b.tool_calls or []]
    if calls_a or calls_b:
        return calls_a == calls_b
    return (a.content or "").strip() == (b.content or "").strip()


def _assistant_turns(messages: Sequence[Message]) -> list[int]:
    return [i for i, m in enumerate(messages) if m.role == "assistant"]


def first_departure(expert: StoreExpert, task: Task, flags: dict[str, bool], messages: Sequence[Message]
                    ) -> int | None:
    """The first assistant turn (0-based) of `messages` whose message is not the teacher's label
    for the state before it; None when every turn is."""
    for n, i in enumerate(_assistant_turns(messages)):
        if not same_message(messages[i], expert.next_message(task, flags, messages[:i])):
            return n
    return None


def explaining_flags(expert: StoreExpert, task: Task, drawn: dict[str, bool], messages: Sequence[Message]
                     ) -> tuple[dict[str, bool], int | None]:
    """The skill draw the teacher can make under which it follows `messages` longest (module
    docstring), and its first departure."""
    best: tuple[tuple[float, int], dict[str, bool], int | None] | None = None
    p = expert.config.skills
    possible = [[v for v in (True, False) if (p[c] > 0 if v else p[c] < 1)] for c in CAPABILITIES]
    for values in itertools.product(*possible):
        flags = dict(zip(CAPABILITIES, values, strict=True))
        d = first_departure(expert, task, flags, messages)
        score = (float("inf") if d is None else d, sum(flags[c] == drawn[c] for c in CAPABILITIES))
        if best is None or score > best[0]:
            best = (score, flags, d)
    assert best is not None
    return best[1], best[2]


def recovery_episode(env: StoreEnv, expert: StoreExpert, learner: Trajectory, rng: random.Random
                     ) -> Trajectory | None:
    """The recovery episode of one learner episode (module docstring), or None when the learner
    followed its teacher throughout."""
    env.reset(learner.seed)
    task = env.task
    flags, d = explaining_flags(expert, task, expert.skill_flags(learner.seed, learner.sample_index),
                                learner.messages)
    if d is None:
        return None
    turns = _assistant_turns(learner.messages)
    replay = [learner.messages[i] for i in turns]
    k = rng.randint(d, len(replay) - 1)

    def policy(history: list[Message], tools: list[dict[str, Any]]) -> Message:
        n = sum(1 for m in history if m.role == "assistant")
        return replay[n] if n < k else expert.next_message(task, flags, history)

    traj = run_episode(env, policy, learner.seed, sample_index=learner.sample_index,
                       policy=PolicyInfo(model="store-scripted-expert", version=expert.config.digest()),
                       env_params={"task_types": ",".join(env.task_types)})
    upto = turns[k]  # the state the teacher takes over in: all before turn k
    if [m.model_dump() for m in traj.messages[:upto]] != [m.model_dump() for m in learner.messages[:upto]]:
        raise FailedPrecondition(f"seed {learner.seed}: replaying the learner's first {k} turns did not reach the "
                                 "state it saw (another task type, or an environment not deterministic in the "
                                 "agent's actions): label the episode in the environment it was played in")
    traj.info.update({FROM_TURN: k, "first_departure": d, "expert_skills": flags,
                      "learner_success": learner.success})
    return traj


def recovery_episodes(expert: StoreExpert, learner: Sequence[Trajectory], *, seed: int = 0,
                      task_types: str | None = None) -> list[Trajectory]:
    """`recovery_episode` for each learner episode that departs from its teacher."""
    env = StoreEnv(task_types=task_types)
    out = []
    for traj in learner:
        rng = random.Random(f"dagger:{seed}:{traj.seed}:{traj.sample_index}")
        episode = recovery_episode(env, expert, traj, rng)
        if episode is not None:
            out.append(episode)
    return out


def recovery_examples(tokenizer: Any, trajectories: Sequence[Trajectory]) -> list[Any]:
    """SFT examples of recovery episodes: loss on the assistant turns from `info[FROM_TURN]` on
    (the teacher's), none on the learner's replayed turns before it."""
    # sft._inside_spans is the one token-in-span rule build_examples uses; reused, not restated.
    from trace_common.agents.sft import SFTExample, _inside_spans

    chat = ChatFormat(tokenizer)
    out = []
    for traj in trajectories:
        k = traj.info.get(FROM_TURN)
        if not isinstance(k, int) or k < 0:
            raise InvalidArgument(field=f"trajectory(seed={traj.seed}).info.{FROM_TURN}",
                                  expected="the first imitated assistant turn (an integer >= 0)", got=k,
                                  fix="make recovery episodes with dagger.recovery_episodes")
        text, spans = chat.assistant_spans(traj.messages, traj.tools)
        if k >= len(spans):
            continue
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        mask = _inside_spans(enc["offset_mapping"], spans[k:])
        if not any(mask):
            raise FailedPrecondition("no token falls inside an imitated assistant span: the tokenizer's offsets do "
                                     "not match the rendered text (a fast tokenizer is required)")
        out.append(SFTExample(list(enc["input_ids"]), mask))
    return out
