"""Warm-start data: scripted-expert trajectories of the built-in `store` domain.

The expert (`trace_common.domains.store.StoreExpert`) carries the planted, partial
capability gaps; a base agent that imitates it inherits them. Episodes are drawn from the
train split only (seeds `first_seed, first_seed + 1, ...`), so the test split used to
measure the base agent is never seen during the warm start.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator

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

    @field_validator("skills")
    @classmethod
    def _skills(cls, skills: dict[str, float] | None) -> dict[str, float] | None:
        if skills is None:
            return None
        from trace_common.domains.store import ExpertConfig

        return ExpertConfig(skills=skills).skills  # validates names and ranges; fills the rest with 1.0


def expert_trajectories(data: WarmStartData) -> list[Trajectory]:
    """Play the expert on `data.episodes` consecutive train seeds."""
    from trace_common.domains.store import DEFAULT_SKILLS, SPLITS, ExpertConfig, StoreEnv, StoreExpert

    train = SPLITS["train"]
    last = data.first_seed + data.episodes
    if last > train.stop:
        raise InvalidArgument(field="first_seed", expected=f"first_seed + episodes <= {train.stop} (train split)",
                              got=data.first_seed)
    expert = StoreExpert(ExpertConfig(skills=data.skills if data.skills is not None else dict(DEFAULT_SKILLS),
                                      seed=data.expert_seed))
    env = StoreEnv(task_types=data.task_types)
    return [expert.play(env, seed) for seed in range(data.first_seed, last)]


def render_texts(trajectories: Sequence[Trajectory]) -> list[str]:
    """The conversations as a TRACE-template model sees them: what its tokenizer is trained on and
    what the warm start imitates (and what `provenance.data_digest` hashes)."""
    from trace_common.policy.chat import TRACE_CHATML_TEMPLATE, render_template_text

    return [render_template_text(TRACE_CHATML_TEMPLATE, t.messages, t.tools) for t in trajectories]


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
