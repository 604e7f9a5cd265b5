"""Group play: shared instance per group, guidance only where asked (each instance's own, or the
override) and only as an <expert_guidance> block at the end of the system prompt, deterministic
lockstep batches."""

from __future__ import annotations

import asyncio

import pytest

from services.trainer.grpo.guidance import shown_guidance
from services.trainer.grpo.rollouts import EpisodeSpec, play_groups
from tests.unit.trainer.grpo.helpers import TOOL_HINT, ToolEnv, tiny_model, tiny_tokenizer, tool_hint
from trace_common.env.guidance import OPEN, guidance_block, has_guidance_block, with_guidance_block
from trace_common.errors import ContextExhausted
from trace_common.policy.base import AssistantTurn, Policy, SamplingParams
from trace_common.policy.chat import ChatFormat
from trace_common.policy.errors import PolicyUnavailable
from trace_common.policy.transformers_backend import TransformersPolicy

HINT = TOOL_HINT


def _play(model, specs, guidance=HINT, env=ToolEnv):
    policy = TransformersPolicy.from_model(model, tiny_tokenizer(), max_wait_s=0.0)

    async def go():
        try:
            return await play_groups(policy, env, specs, params=SamplingParams(max_tokens=12),
                                     guidance_text=guidance, max_turns=2)
        finally:
            await policy.close()
    return asyncio.run(go())


def specs(groups=2, g=4, guided=1):
    return [EpisodeSpec(seed=100 + k, group=k, index=i, guided=i < guided, sampling_seed=1000 * k + i)
            for k in range(groups) for i in range(g)]


def _key(seed: int) -> str:
    env = ToolEnv()
    env.reset(seed)
    return env.key


def _render(messages, tools) -> list[int]:
    """The prompt ids the in-process policy builds for a request of `messages` (TransformersPolicy)."""
    tok = tiny_tokenizer()
    return list(tok(ChatFormat(tok).render(messages, tools, add_generation_prompt=True),
                    add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("source, env, override", [
    ("override", lambda: ToolEnv(hint="none"), HINT),       # config.guidance_text: the same text everywhere
    ("instance", lambda: ToolEnv(hint="instance"), ""),     # each instance's Observation.guidance
    ("override beats instance", lambda: ToolEnv(hint="instance"), HINT),
    ("no hint anywhere", lambda: ToolEnv(hint="none"), ""),  # a guided spec plays unguided, recorded so
])
def test_group_shares_instance_and_guidance_only_in_system_prompts(source, env, override):
    trajs = _play(tiny_model(seed=2), specs(guided=2), guidance=override, env=env)
    tok = tiny_tokenizer()
    hints = {k: tool_hint(_key(100 + k)) for k in range(2)}
    for k in range(2):
        group = trajs[4 * k: 4 * k + 4]
        assert {t.seed for t in group} == {100 + k}
        assert len({t.messages[1].content for t in group}) == 1  # same task instance
        expected = "" if source == "no hint anywhere" else (override or hints[k])
        for t in group:
            guided = t.sample_index < 2 and bool(expected)
            assert shown_guidance(t) == (expected if guided else "")
            assert not has_guidance_block(t.messages)               # the record is the plain conversation
            assert "Hint:" not in "".join(m.content or "" for m in t.messages)
            for r in t.turns:                                        # every turn's prompt, token for token
                plain = t.messages[:r.message_index]
                shown = with_guidance_block(plain, expected) if guided else plain
                assert r.prompt_token_ids == _render(shown, t.tools)
            first_prompt = tok.decode(t.turns[0].prompt_token_ids)
            assert (OPEN in first_prompt) == guided == ("Hint:" in first_prompt)
            if guided:  # this instance's guidance (never the other group's), at the end of the system prompt
                system, user = first_prompt.split("<|im_start|>user", 1)
                assert guidance_block(expected) in system and hints[1 - k] not in first_prompt
                assert OPEN not in user


def test_lockstep_is_deterministic():
    model = tiny_model(seed=5)
    a = _play(model, specs(guided=2))
    b = _play(model, specs(guided=2))
    ids = lambda ts: [[r.completion_token_ids for r in t.turns] for t in ts]  # noqa: E731
    assert ids(a) == ids(b)
    assert [t.reward for t in a] == [t.reward for t in b]


class _ShortContext(Policy):
    """A policy whose context holds every conversation but the one about `long_key` after its first
    turn: a batch holding that one fails as a whole (as `generate` does), a request alone gets its
    own outcome. It looks the key up first, then answers."""

    name, adapter = "short-context", None

    def __init__(self, long_key: str, down: bool = False):
        super().__init__()
        self.long_key, self.down = long_key, down

    async def generate(self, requests):
        if self.down:
            raise PolicyUnavailable("backend down", kind="connection")
        if any(len(r.messages) > 2 and self.long_key in (r.messages[1].content or "") for r in requests):
            raise ContextExhausted("the prompt has 5000 tokens but the model's context is 4096")
        return [AssistantTurn.from_text("It is 7." if len(r.messages) > 2 else
                                        '<tool_call>{"name": "lookup", "arguments": {"key": "k"}}</tool_call>',
                                        r.turn_index) for r in requests]


@pytest.mark.parametrize("down, terminations", [
    # one conversation past the context ends that episode only; its neighbours are answered
    (False, ["context_exhausted", "done", "done", "done"]),
    # a backend that is down fails every episode of the round, as before
    (True, ["policy_error"] * 4),
])
def test_one_episode_past_the_context_does_not_end_its_batch(down, terminations):
    seeds = [s for s in range(40) if ToolEnv().reset(s).messages[1].content.split()[-1]
             != ToolEnv().reset(0).messages[1].content.split()[-1]][:3]
    seeds = [0, *seeds]                                   # the first one's key is the long one
    long_key = ToolEnv().reset(0).messages[1].content.split()[-1]
    specs_ = [EpisodeSpec(seed=s, group=i, index=0, guided=False, sampling_seed=s) for i, s in enumerate(seeds)]
    trajs = asyncio.run(play_groups(_ShortContext(long_key, down=down), lambda: ToolEnv(hint="none"), specs_,
                                    params=SamplingParams(max_tokens=4)))
    assert [str(t.termination) for t in trajs] == terminations
    assert all(t.error is None for t in trajs) is (not down)
    assert [t.assistant_turns() for t in trajs] == ([1, 2, 2, 2] if not down else [0] * 4)
