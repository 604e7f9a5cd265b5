"""Warm-start data: scripted-expert trajectories of the built-in `store` domain.

The expert (`trace_common.domains.store.StoreExpert`) carries the planted, partial
capability gaps; a base agent that imitates it inherits them. Episodes are drawn from the
train split only (seeds `first_seed, first_seed + 1, ...`), so the test split used to
measure the base agent is never seen during the warm start.

Guided episodes: a seeded share (`guided_fraction`) of the episodes is played instead by the
expert with every skill on, and its system prompt carries an `<expert_guidance>` block
(`trace_common.env.guidance`) listing exactly the actions that skilled expert then takes
(`skilled_actions`). Imitating them teaches the base agent to follow such a block, the way the
capability environments and the GRPO trainer show their oracle's gold actions. Only this
builder adds the block: the domain's tasks and every evaluation stay unguided.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trace_common.env.guidance import CLOSE, HEADER, OPEN, gold_actions_text, with_guidance_block
from trace_common.env.messages import Message
from trace_common.env.trajectory import Trajectory
from trace_common.errors import InvalidArgument


class WarmStartData(BaseModel):
    """Which expert trajectories a base agent is warm-started on."""

    model_config = ConfigDict(extra="forbid")

    episodes: int = Field(2000, ge=1, le=100_000, description="Expert episodes (train-split seeds).")
    first_seed: int = Field(0, ge=0, description="First train seed; episodes use consecutive seeds.")
    skills: dict[str, float] | None = Field(
        None, description="Capability -> probability the expert shows the skill in an episode (the planted "
                          "partial gaps). None = the store domain's DEFAULT_SKILLS.")
    expert_seed: int = Field(0, ge=0, description="Seed of the expert's per-episode skill draws.")
    task_types: str | None = Field(None, description="Comma-separated subset of the store's task types "
                                                     "(None = all).")
    guided_fraction: float = Field(
        0.0, ge=0.0, le=1.0,
        description="Share of the episodes played by the expert with every skill on, whose system prompt "
                    "carries an <expert_guidance> block with exactly those actions (the base agent learns to "
                    "follow guidance). round(guided_fraction * episodes) episodes, chosen by a draw seeded "
                    "by expert_seed. 0 (the default here; `micro` sets 0.25) = no guidance in the warm start.")

    @field_validator("skills")
    @classmethod
    def _skills(cls, skills: dict[str, float] | None) -> dict[str, float] | None:
        if skills is None:
            return None
        from trace_common.domains.store import ExpertConfig

        return ExpertConfig(skills=skills).skills  # validates names and ranges; fills the rest with 1.0


def guided_seeds(data: WarmStartData) -> set[int]:
    """The train seeds of `data` whose episode is guided: round(guided_fraction * episodes) of them,
    a sample drawn from a generator seeded by `expert_seed`."""
    seeds = range(data.first_seed, data.first_seed + data.episodes)
    n = round(data.guided_fraction * data.episodes)
    return set(random.Random(f"guided:{data.expert_seed}").sample(seeds, n))


def message_actions(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Assistant messages as gold action dicts (`{"name", "arguments"}` per tool call, `{"message"}`
    per text), in order: what `gold_actions_text` renders."""
    actions: list[dict[str, Any]] = []
    for m in messages:
        if m.role != "assistant":
            continue
        if m.content:
            actions.append({"message": m.content})
        actions += [{"name": tc.function.name, "arguments": json.loads(tc.function.arguments)}
                    for tc in m.tool_calls or []]
    return actions


def skilled_actions(env: Any) -> list[dict[str, Any]]:
    """The gold actions of the env's current store task: what the expert with every skill on
    does (it solves every task), as action dicts."""
    from trace_common.domains.store import CAPABILITIES, ExpertConfig, StoreExpert

    return message_actions(StoreExpert(ExpertConfig.perfect()).plan(env.task, dict.fromkeys(CAPABILITIES, True)))


def guided_trajectory(env: Any, seed: int) -> Trajectory:
    """The skilled expert's episode on `seed` with its gold actions as a guidance block in the
    system prompt (the expert's replies do not depend on the prompt, so they are the same)."""
    from trace_common.domains.store import ExpertConfig, StoreExpert

    traj = StoreExpert(ExpertConfig.perfect()).play(env, seed)
    text = gold_actions_text(skilled_actions(env))
    traj = traj.model_copy(update={"messages": with_guidance_block(traj.messages, text)})
    traj.info["guided"] = True
    return traj


#: The block's fixed text, added to the tokenizer's training text (`tokenizer_texts`) of a build with
#: guided episodes, so its tags and header are merged tokens even when those episodes are few.
GUIDANCE_LEXICON = f"{OPEN}\n{HEADER}\n{CLOSE}"


def expert_trajectories(data: WarmStartData) -> list[Trajectory]:
    """Play the expert on `data.episodes` consecutive train seeds; the `guided_seeds` episodes
    are `guided_trajectory`s."""
    from trace_common.domains.store import DEFAULT_SKILLS, SPLITS, ExpertConfig, StoreEnv, StoreExpert

    train = SPLITS["train"]
    last = data.first_seed + data.episodes
    if last > train.stop:
        raise InvalidArgument(field="first_seed", expected=f"first_seed + episodes <= {train.stop} (train split)",
                              got=data.first_seed)
    expert = StoreExpert(ExpertConfig(skills=data.skills if data.skills is not None else dict(DEFAULT_SKILLS),
                                      seed=data.expert_seed))
    env = StoreEnv(task_types=data.task_types)
    guided = guided_seeds(data)
    return [guided_trajectory(env, seed) if seed in guided else expert.play(env, seed)
            for seed in range(data.first_seed, last)]


def render_texts(trajectories: Sequence[Trajectory]) -> list[str]:
    """The conversations as a TRACE-template model sees them: what its tokenizer is trained on and
    what the warm start imitates (and what `provenance.data_digest` hashes)."""
    from trace_common.policy.chat import TRACE_CHATML_TEMPLATE, render_template_text

    return [render_template_text(TRACE_CHATML_TEMPLATE, t.messages, t.tools) for t in trajectories]


def tokenizer_texts(texts: Sequence[str]) -> list[str]:
    """What a built-in agent's tokenizer is trained on: the rendered conversations and, when any of
    them shows guidance, twice (BPE merges need two occurrences) the guidance block's tags and
    header. A build without guided episodes gets the tokenizer it had before guidance existed (the
    block never reaches such an agent)."""
    if not any(OPEN in t for t in texts):
        return list(texts)
    return [*texts, GUIDANCE_LEXICON, GUIDANCE_LEXICON]


def rendered_texts(data: WarmStartData) -> list[str]:
    """`render_texts(expert_trajectories(data))`."""
    return render_texts(expert_trajectories(data))


def held_out_data(data: WarmStartData, episodes: int = 32) -> WarmStartData:
    """Expert episodes on train seeds right after the warm-start ones (never trained on),
    for the teacher-forced accuracy recorded with a build."""
    from trace_common.domains.store import SPLITS

    first = data.first_seed + data.episodes
    if first + episodes > SPLITS["train"].stop:
        first = max(0, data.first_seed - episodes)
    return data.model_copy(update={"first_seed": first, "episodes": episodes})
