"""Guided imitation episodes (issue #31 item 3): the configured share of the warm-start data shows
the skilled expert's gold actions as an <expert_guidance> block and then takes exactly those
actions; the rest is the partially skilled expert, unguided, as before."""

from __future__ import annotations

import random

import pytest

from trace_common.agents.data import (
    GUIDANCE_LEXICON,
    WarmStartData,
    expert_trajectories,
    guided_seeds,
    message_actions,
    render_texts,
    skilled_actions,
    tokenizer_texts,
)
from trace_common.agents.guided_probe import _store_env_class, teacher_probe
from trace_common.agents.sft import SFTExample, _batches, build_examples
from trace_common.agents.tokenizer import train_tokenizer
from trace_common.domains.store import CAPABILITIES, ExpertConfig, StoreEnv, StoreExpert
from trace_common.domains.store.subgoals import episode_subgoals, subgoal_rates
from trace_common.env.guidance import (
    CLOSE,
    HEADER,
    OPEN,
    gold_actions_text,
    guidance_block,
    has_guidance_block,
)

HALF = dict.fromkeys(CAPABILITIES, 0.5)


def _data(episodes: int, fraction: float, first_seed: int = 0) -> WarmStartData:
    return WarmStartData(episodes=episodes, first_seed=first_seed, skills=HALF, guided_fraction=fraction)


@pytest.mark.parametrize(("episodes", "fraction", "first_seed"), [
    (8, 0.25, 0), (10, 0.5, 100), (6, 0.0, 0), (4, 1.0, 7), (12, 0.3, 40)])
def test_the_configured_share_is_guided_by_the_skilled_experts_own_actions(episodes, fraction, first_seed):
    data = _data(episodes, fraction, first_seed)
    trajs = expert_trajectories(data)
    guided = [t for t in trajs if has_guidance_block(t.messages)]
    assert len(guided) == round(fraction * episodes) == len(guided_seeds(data))
    assert {t.seed for t in guided} == guided_seeds(data)
    env, partial = StoreEnv(), StoreExpert(ExpertConfig(skills=HALF))
    for t in trajs:
        plain = env.reset(t.seed).messages
        if t.seed in guided_seeds(data):
            gold = skilled_actions(env)
            text = gold_actions_text(gold)
            assert t.messages[0].content == f"{plain[0].content}\n\n{guidance_block(text)}"
            block_lines = t.messages[0].content.split(OPEN + "\n", 1)[1].removesuffix("\n" + CLOSE)
            assert block_lines == text and text.startswith(HEADER)
            assert message_actions(t.messages) == gold and t.success
            assert t.info["guided"] is True
        else:
            assert t.messages[0] == plain[0] and not has_guidance_block(t.messages)
            assert t.messages == partial.play(StoreEnv(), t.seed).messages  # the unguided data is as before
            assert "guided" not in t.info


def test_guided_seeds_are_a_seeded_draw():
    a, b = _data(40, 0.25), _data(40, 0.25)
    other = WarmStartData(episodes=40, skills=HALF, guided_fraction=0.25, expert_seed=1)
    assert guided_seeds(a) == guided_seeds(b) != guided_seeds(other)


@pytest.mark.parametrize("fraction", [-0.1, 1.5])
def test_guided_fraction_outside_0_1_is_refused(fraction):
    with pytest.raises(ValueError, match="guided_fraction"):
        WarmStartData(guided_fraction=fraction)


@pytest.mark.parametrize("piece", [OPEN, CLOSE, HEADER])
def test_the_tokenizer_learns_the_blocks_tags_and_header(piece):
    texts = render_texts(expert_trajectories(_data(6, 0.34)))  # 2 of 6 conversations guided
    tok = train_tokenizer(tokenizer_texts(texts), 1024)
    words = [w for w, _ in tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str(piece)]
    assert len(tok(piece, add_special_tokens=False)["input_ids"]) == len(words)  # one token per pre-token
    assert tokenizer_texts(texts)[-2:] == [GUIDANCE_LEXICON] * 2


def test_a_build_without_guided_episodes_trains_the_tokenizer_it_had_before():
    texts = render_texts(expert_trajectories(_data(6, 0.0)))
    assert all(OPEN not in t for t in texts) and tokenizer_texts(texts) == texts


@pytest.mark.parametrize(("n_guided", "n_plain", "batch_size"), [(3, 13, 2), (9, 7, 4), (2, 30, 4)])
def test_a_batch_never_mixes_guided_and_plain_examples(n_guided, n_plain, batch_size):
    rng = random.Random(0)
    examples = [SFTExample([1] * rng.randint(3, 30), [True] * 3, group=int(i < n_guided))
                for i in range(n_guided + n_plain)]
    batches = _batches(examples, batch_size, random.Random(1))
    seen = [next(batches) for _ in range(40)]
    assert {len({e.group for e in b}) for b in seen} == {1}
    assert {e.group for b in seen for e in b} == {0, 1}


def test_build_examples_groups_guided_trajectories():
    trajs = expert_trajectories(_data(6, 0.5))
    tok = train_tokenizer(tokenizer_texts(render_texts(trajs)), 1024)
    groups = [e.group for e in build_examples(tok, trajs)]
    assert groups == [int(has_guidance_block(t.messages)) for t in trajs] and sum(groups) == 3


@pytest.mark.parametrize(("guided", "has_block"), [(False, False), (True, True)])
def test_only_the_probes_guided_env_shows_guidance(guided, has_block):
    env = _store_env_class()() if guided else StoreEnv()
    obs = env.reset(500_000)
    assert has_guidance_block(obs.messages) is has_block
    if guided:
        assert obs.messages[0].content.endswith(guidance_block(gold_actions_text(skilled_actions(env))))


@pytest.mark.parametrize(("skills", "perfect"), [
    (dict.fromkeys(CAPABILITIES, 1.0), set(CAPABILITIES)),
    ({"multi_step_task_completion": 0.0}, set(CAPABILITIES) - {"multi_step_task_completion"}),
    ({"tool_call_precision": 0.0}, set(CAPABILITIES) - {"tool_call_precision"})])
def test_subgoal_rates_locate_the_missing_skill(skills, perfect):
    out = teacher_probe(WarmStartData(skills=skills), "dev", episodes=30, samples=1)
    rates = {c: r["rate"] for c, r in out["subgoal_success"].items()}
    assert set(rates) == set(CAPABILITIES)
    assert {c for c, r in rates.items() if r == 1.0} == perfect
    assert (out["pass_rate"] == 1.0) is (perfect == set(CAPABILITIES))


def test_subgoal_rates_count_every_subrequest_need():
    trajs = [StoreExpert(ExpertConfig.perfect()).play(StoreEnv(), s) for s in (500_000, 500_001)]
    env = StoreEnv()
    expected: dict[str, int] = {}
    for s in (500_000, 500_001):
        env.reset(s)
        multi = "multi_step_task_completion" in env.task.capabilities
        for i, sr in enumerate(env.task.subrequests):
            for c in {*sr.capabilities, *(["multi_step_task_completion"] if multi and i else [])}:
                expected[c] = expected.get(c, 0) + 1
    assert subgoal_rates(trajs) == {c: [n, n] for c, n in sorted(expected.items())}


@pytest.mark.parametrize(("skills", "later_requests_met"), [
    ({c: 1.0 for c in CAPABILITIES}, True),                                       # the perfect expert meets them
    ({**{c: 1.0 for c in CAPABILITIES}, "multi_step_task_completion": 0.0}, False),  # handles the first only
])
def test_episode_subgoals_lists_each_subrequests_needs_in_order(skills, later_requests_met):
    expert, env, seen = StoreExpert(ExpertConfig(skills=skills)), StoreEnv(), 0
    for seed in range(500_000, 500_040):
        traj = expert.play(env, seed)
        goals = episode_subgoals(traj)
        assert [i for i, _, _ in goals] == sorted(i for i, _, _ in goals)
        env.reset(seed)
        if "multi_step_task_completion" in env.task.capabilities and len(env.task.subrequests) > 1:
            later = [met for i, c, met in goals if i > 0 and c == "multi_step_task_completion"]
            assert later and all(met is later_requests_met for met in later)
            seen += 1
    assert seen >= 3
