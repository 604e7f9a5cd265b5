"""Group play: shared instance per group, guidance only where asked, deterministic lockstep batches."""

from __future__ import annotations

import asyncio

import pytest

from services.trainer.grpo.rollouts import EpisodeSpec, play_groups, with_guidance
from tests.unit.trainer.grpo.helpers import ToolEnv, tiny_model, tiny_tokenizer
from trace_common.env import Message
from trace_common.policy.base import SamplingParams
from trace_common.policy.transformers_backend import TransformersPolicy

HINT = ToolEnv.guidance_text


@pytest.mark.parametrize("position, messages, expected", [
    ("user", [Message.system("S"), Message.user("U")], [("system", "S"), ("user", f"U\n\n{HINT}")]),
    ("system", [Message.system("S"), Message.user("U")], [("system", f"S\n\n{HINT}"), ("user", "U")]),
    ("system", [Message.user("U")], [("system", HINT), ("user", "U")]),
    # only the first user message gets the hint
    ("user", [Message.user("A"), Message.user("B")], [("user", f"A\n\n{HINT}"), ("user", "B")]),
])
def test_with_guidance(position, messages, expected):
    out = with_guidance(messages, HINT, position)
    assert [(m.role, m.content) for m in out] == expected
    assert [m.content for m in messages] == [c for _, c in ([(m.role, m.content) for m in messages])]  # not mutated


def _play(model, specs, guidance=HINT):
    policy = TransformersPolicy.from_model(model, tiny_tokenizer(), max_wait_s=0.0)

    async def go():
        try:
            return await play_groups(policy, ToolEnv, specs, params=SamplingParams(max_tokens=12),
                                     guidance_text=guidance, max_turns=2)
        finally:
            await policy.close()
    return asyncio.run(go())


def specs(groups=2, g=4, guided=1):
    return [EpisodeSpec(seed=100 + k, group=k, index=i, guided=i < guided, sampling_seed=1000 * k + i)
            for k in range(groups) for i in range(g)]


def test_group_shares_instance_and_guidance_only_in_prompts():
    trajs = _play(tiny_model(seed=2), specs())
    tok = tiny_tokenizer()
    for k in range(2):
        group = trajs[4 * k: 4 * k + 4]
        assert {t.seed for t in group} == {100 + k}
        assert len({t.messages[1].content for t in group}) == 1  # same task instance
        for t in group:
            assert HINT not in "".join(m.content or "" for m in t.messages)  # the record is unguided
            first_prompt = tok.decode(t.turns[0].prompt_token_ids)
            assert (HINT in first_prompt) == (t.sample_index == 0)


def test_lockstep_is_deterministic():
    model = tiny_model(seed=5)
    a = _play(model, specs(guided=2))
    b = _play(model, specs(guided=2))
    ids = lambda ts: [[r.completion_token_ids for r in t.turns] for t in ts]  # noqa: E731
    assert ids(a) == ids(b)
    assert [t.reward for t in a] == [t.reward for t in b]
