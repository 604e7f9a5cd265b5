"""Guided rollouts through the trainer: each instance's guidance as an <expert_guidance> block at
the end of the system prompt of exactly the guided share of every group (resampled groups too),
never in unguided prompts nor in the training tensors (the loss sees the plain render); asking for
guidance from an environment that has none fails before training; guided and unguided metrics
every iteration."""

from __future__ import annotations

import statistics

import pytest

from services.trainer.grpo.batch import build_sequences
from services.trainer.grpo.config import GRPOConfig
from services.trainer.grpo.guidance import PROBE_INSTANCES, shown_guidance
from services.trainer.grpo.rollouts import PolicyRollouts
from services.trainer.grpo.session import make_trainer
from tests.unit.trainer.grpo.helpers import (
    PickEnv,
    ToolEnv,
    pick_hint,
    tiny_model,
    tiny_tokenizer,
    warm_model,
)
from trace_common.env.guidance import CLOSE, OPEN, guidance_block, has_guidance_block, with_guidance_block
from trace_common.errors import FailedPrecondition

OVERRIDE = "Hint: any word works."


class Recording(PolicyRollouts):
    """The trainer's in-process rollouts, keeping every batch of trajectories it played."""

    def __init__(self, policy):
        super().__init__(policy)
        self.calls: list[list] = []

    async def play(self, *args, **kwargs):
        trajs = await super().play(*args, **kwargs)
        self.calls.append(trajs)
        return trajs


def trainer_for(env, *, model=None, **kw):
    cfg = dict(max_steps=1, groups_per_batch=3, num_generations=8, max_completion_length=4, learning_rate=5e-3,
               save_steps=0, seed=5, lora_r=4, lora_alpha=8, early_stop_uninformative_iterations=0)
    cfg.update(kw)
    rows: list[dict] = []
    trainer = make_trainer(GRPOConfig(**cfg), model or warm_model("pick"), tiny_tokenizer(), env,
                           on_event=lambda k, p: rows.append(p["values"]) if k == "iteration" else None)
    trainer.engine = Recording(trainer.engine.policy)
    updates: list[list] = []
    update = trainer._update

    def spy(episodes):
        updates.append(episodes)
        return update(episodes)
    trainer._update = spy
    return trainer, rows, updates


def first_prompt(t) -> str:
    return tiny_tokenizer().decode(t.turns[0].prompt_token_ids)


@pytest.mark.parametrize("fraction, G, override, resample, guided", [
    (0.25, 8, "", 0, 2),          # each instance's own guidance, as the block in the system prompt
    (0.5, 4, "", 0, 2),           # the reference's upper share
    (0.25, 4, "", 0, 1),
    (0.25, 6, "", 0, 2),          # 1.5 rounds half up
    (0.25, 10, "", 0, 3),         # 2.5 rounds half up
    (0.25, 8, OVERRIDE, 0, 2),    # config.guidance_text replaces every instance's guidance
    (0.25, 8, "", 2, 2),          # every group uninformative: two resample rounds, each guided alike
    (0.0, 8, "", 0, 0),           # no guidance asked: nobody sees what the env supplies
])
def test_block_in_exactly_the_guided_share_of_every_group(fraction, G, override, resample, guided):
    env = (lambda: PickEnv(hint=True, constant=0.0)) if resample else (lambda: PickEnv(hint=True))
    trainer, _, _ = trainer_for(env, guidance_fraction=fraction, num_generations=G, guidance_text=override,
                                max_resample_rounds=resample)
    assert trainer.n_guided == guided
    trainer.train(resume=False, write_adapter=False)
    assert len(trainer.engine.calls) == 1 + resample              # the first round, then each resample round
    seen: set[int] = set()
    for trajs in trainer.engine.calls:
        assert len(trajs) == 3 * G
        by_seed: dict[int, list] = {}
        for t in trajs:
            by_seed.setdefault(t.seed, []).append(t)
        assert len(by_seed) == 3 and not seen & set(by_seed)      # resampled groups are fresh instances
        seen |= set(by_seed)
        for seed, group in by_seed.items():
            text = override or pick_hint(seed)
            others = [pick_hint(s) for s in by_seed if s != seed and pick_hint(s) != pick_hint(seed)]
            shown = [t for t in group if OPEN in first_prompt(t)]
            assert len(shown) == guided
            assert sorted(t.sample_index for t in shown) == list(range(guided))   # the first ones of the group
            for t in group:
                plain = t.messages[:t.turns[0].message_index]
                is_shown = t in shown
                assert shown_guidance(t) == (text if is_shown else "")          # which text was shown
                assert not has_guidance_block(t.messages)                       # the record is plain
                # the sampler's prompt, token for token: the block at the end of the system prompt, or none
                expected = with_guidance_block(plain, text) if is_shown else plain
                assert t.turns[0].prompt_token_ids == trainer.render(expected, t.tools)
                prompt = first_prompt(t)
                assert not any(o in prompt for o in others)                     # never another instance's
                assert ("Hint:" in prompt) is is_shown
                if is_shown:
                    system, user = prompt.split("<|im_start|>user", 1)
                    assert system.rstrip().endswith(f"{guidance_block(text)}<|im_end|>")
                    assert "Hint:" not in user and OPEN not in user


def tool_hint_of(seed: int) -> str:
    env = ToolEnv(hint="instance")
    return env.reset(seed).guidance


CASES = {  # kind -> (env factory, the instance's hint, trainer settings, warm-started model)
    "pick": (lambda: PickEnv(hint=True), pick_hint, dict(max_steps=2), "pick"),
    "tool": (lambda: ToolEnv(hint="instance"), tool_hint_of,
             dict(max_steps=2, num_generations=4, guidance_fraction=0.5, max_completion_length=24, max_turns=2),
             "tool"),
}


@pytest.mark.parametrize("kind", ["pick", pytest.param("tool", marks=pytest.mark.slow)])
@pytest.mark.parametrize("mode", ["importance_weighted", "exclude"])
def test_training_tensors_of_guided_episodes_hold_no_block(kind, mode):
    env, hint_of, settings, warm = CASES[kind]
    trainer, rows, updates = trainer_for(env, model=warm_model(warm), **{"guidance_fraction": 0.25, **settings,
                                                                          "guidance_mode": mode})
    trainer.train(resume=False, write_adapter=False)
    assert updates, "no informative group: nothing was trained on"
    tok = tiny_tokenizer()
    played = {(t.seed, t.sample_index): t for call in trainer.engine.calls for t in call}
    guided_seen = 0
    for episodes in updates:
        trained: dict[int, list[int]] = {}
        seqs = build_sequences(episodes)
        for s in seqs:
            text = tok.decode(s.input_ids)
            assert OPEN not in text and CLOSE not in text and "Hint:" not in text  # not in the tensors at all
            trained.setdefault(s.episode, []).extend(i for i, on in zip(s.input_ids, s.target, strict=True) if on)
        for e, ep in enumerate(episodes):
            traj = played[(ep.seed, ep.index)]
            assert ep.guided == bool(shown_guidance(traj))
            # the tokens the loss scores are exactly the sampled ones, turn by turn
            assert trained.get(e, []) == [i for r in traj.turns for i in r.completion_token_ids]
            # every prompt the loss sees is the plain render of the conversation (the guided ones re-rendered)
            plain = [trainer.render(traj.messages[:r.message_index], traj.tools) for r in traj.turns]
            assert [t.prompt_ids for t in ep.turns] == plain
            if ep.guided:
                guided_seen += 1
                assert guidance_block(hint_of(ep.seed)) in first_prompt(traj)  # the sampler did see it
                assert [r.prompt_token_ids for r in traj.turns] != plain
    assert guided_seen > 0
    per_group = trainer.config.num_generations - trainer.n_guided
    trained_rows = [r for r in rows if "trained_episodes" in r]
    if mode == "exclude":  # guided episodes leave the loss (their tokens carry no weight)
        assert all(r["trained_episodes"] <= r["groups_trained"] * per_group for r in trained_rows)
    else:
        assert all(0.0 < r["importance_weight_mean"] <= 1.0 for r in trained_rows)


class CountingPick(PickEnv):
    """PickEnv counting resets and released episodes (across every instance the factory made)."""

    resets = 0
    released = 0

    def reset(self, seed):
        CountingPick.resets += 1
        return super().reset(seed)

    def episode_finished(self):
        CountingPick.released += 1


@pytest.mark.parametrize("hint, kw, error, probes", [
    (False, dict(guidance_fraction=0.25), "supplies no guidance", PROBE_INSTANCES),   # asked, none: error
    (False, dict(guidance_fraction=0.25, guidance_text=OVERRIDE), None, 0),          # the override supplies it
    (False, dict(guidance_fraction=0.0), None, 0),                                   # not asked
    (True, dict(guidance_fraction=0.25), None, 1),                                   # the first instance has one
])
def test_asking_for_guidance_from_an_environment_without_any(hint, kw, error, probes):
    CountingPick.resets = CountingPick.released = 0
    if error:
        with pytest.raises(FailedPrecondition) as info:
            trainer_for(lambda: CountingPick(hint=hint), model=tiny_model(), **kw)
        msg = str(info.value)
        for part in ("'pick'", "config.guidance_fraction=0.25", "guidance_text", "set guidance_fraction: 0",
                     "'train' split"):
            assert part in msg, (part, msg)
    else:
        trainer, _, _ = trainer_for(lambda: CountingPick(hint=hint), model=tiny_model(), **kw)
        assert trainer.n_guided == (2 if kw["guidance_fraction"] else 0)
    assert CountingPick.resets == CountingPick.released == probes   # probed before training, episodes released


def test_a_multi_turn_environment_without_hints_is_refused_too():
    with pytest.raises(FailedPrecondition, match="'toolenv' supplies no guidance"):
        make_trainer(GRPOConfig(guidance_fraction=0.5, num_generations=4), tiny_model(), tiny_tokenizer(),
                     lambda: ToolEnv(hint="none"))


@pytest.mark.parametrize("fraction, G, guided", [(0.25, 8, 2), (0.5, 4, 2), (0.0, 4, 0)])
def test_guided_and_unguided_metrics_every_iteration(fraction, G, guided):
    trainer, rows, _ = trainer_for(lambda: PickEnv(hint=True), guidance_fraction=fraction, num_generations=G,
                                   max_steps=2)
    trainer.train(resume=False, write_adapter=False)
    assert [r["iteration"] for r in rows] == [1.0, 2.0]
    for r, trajs in zip(rows, trainer.engine.calls, strict=True):
        g = [t for t in trajs if shown_guidance(t)]
        u = [t for t in trajs if not shown_guidance(t)]
        assert r["guided_episodes"] == len(g) == 3 * guided
        assert r["guided_share"] == pytest.approx(guided / G)
        assert r["unguided_reward_mean"] == pytest.approx(statistics.mean(t.reward for t in u))
        if guided:
            assert r["guided_reward_mean"] == pytest.approx(statistics.mean(t.reward for t in g))
        else:
            assert "guided_reward_mean" not in r
        assert 0.0 <= r["informative_group_fraction"] <= 1.0
        assert r["episodes"] == len(trajs)
        assert r["prompt_tokens"] == sum(len(x.prompt_token_ids) for t in trajs for x in t.turns)
        assert r["generated_tokens"] == sum(len(x.completion_token_ids) for t in trajs for x in t.turns)
    assert rows[-1]["rollouts_total"] == sum(r["episodes"] for r in rows) == 2 * 3 * G
    assert rows[-1]["prompt_tokens_total"] == sum(r["prompt_tokens"] for r in rows)
    assert rows[-1]["completion_tokens_total"] == sum(r["generated_tokens"] for r in rows)
