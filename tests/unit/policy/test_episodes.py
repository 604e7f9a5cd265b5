"""`play_episodes`: concurrent episodes through one batched in-process policy, reproducible per
seed, with token data and parse errors recorded in the trajectories."""

from __future__ import annotations

import asyncio

from tests.unit.policy.helpers import tiny_model, tiny_tokenizer
from trace_common.domains.store import StoreEnv
from trace_common.policy.base import SamplingParams
from trace_common.policy.episodes import play_episodes
from trace_common.policy.transformers_backend import TransformersPolicy

TASKS = [(1_000_000, 0), (1_000_001, 0), (1_000_001, 1)]


def play(seed: int):
    async def go():
        policy = TransformersPolicy.from_model(tiny_model(), tiny_tokenizer(), name="tiny", max_wait_s=0.02)
        try:
            trajs = await play_episodes(StoreEnv, policy, TASKS, SamplingParams(seed=seed, max_tokens=6),
                                        max_turns=3)
            return trajs, policy
        finally:
            await policy.close()

    return asyncio.run(go())


def test_episodes_are_batched_reproducible_and_carry_token_data():
    first, policy = play(seed=1)
    again, _ = play(seed=1)
    other, _ = play(seed=2)
    assert [t.to_dict()["messages"] for t in first] == [t.to_dict()["messages"] for t in again]
    assert [t.to_dict()["messages"] for t in first] != [t.to_dict()["messages"] for t in other]
    assert max(policy.batch_sizes) > 1  # the three episodes shared forward passes
    for traj, (seed, index) in zip(first, TASKS, strict=True):
        assert (traj.seed, traj.sample_index) == (seed, index)
        assert traj.policy.model == "tiny"
        # a random tiny model answers in text; the scripted user then ends the episode
        assert 1 <= traj.assistant_turns() == len(traj.turns) <= 3
        assert traj.termination.value in ("done", "max_turns")
        for rec in traj.turns:
            assert traj.messages[rec.message_index].role == "assistant"
            assert len(rec.completion_token_ids) == len(rec.logprobs) <= 6
        assert isinstance(traj.info["parse_errors"], list)
    # the two samples of one task differ (different derived seeds)
    assert first[1].to_dict()["messages"] != first[2].to_dict()["messages"]
