"""Gate training as one job (services.trainer.gates.grpo): warm start from provenance, then GRPO on
the gates only, on the toy world of test_grpo_toy.py (adapter `early` is right on the
`early` environment, `late` on `late`).

Measured on this toy (greedy reward on 32 held-out seeds per environment, 1 thread): zero gates
(every token to the base) score early 1.0 / late 0.0 (the greedy base always answers an a-m
word); after the warm start (300 steps, 16 provenance episodes per capability) 1.0 / 1.0 with
held-out routing accuracy ~0.69. GRPO on the gates alone (no warm start, 15 iterations of 4x8
episodes) did not raise the sampled reward measurably (0.5 -> 0.59, noisy) -- the learning test
therefore holds the warm start to the known answer and GRPO to "trains only the gates, moves them,
and keeps the warm-started routing's reward".
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from services.trainer.gates.grpo import GateGRPOConfig, build_mixture, train_gate_job
from services.trainer.grpo.config import parse_config
from tests.unit.trainer.gates.test_grpo_toy import ENVS, mean_reward, toy_world
from tests.unit.trainer.grpo.helpers import tiny_tokenizer
from trace_common.artifacts import open_store
from trace_common.errors import InvalidArgument
from trace_common.moe.composed import ComposedMoEModel
from trace_common.moe.composition_io import load_composition

NAMES = ["early", "late"]
from tests.unit.trainer.grpo.conftest import _one_thread  # noqa: E402, F401  (autouse: one thread, determinism)

EVAL_SEEDS = range(1000, 1032)
FAST = dict(groups_per_batch=2, num_generations=4, max_completion_length=4, save_steps=0,
            early_stop_uninformative_iterations=0, guidance_fraction=0.0, warm_start_episodes=8)


def composed() -> ComposedMoEModel:
    base_dir, adapters = toy_world()
    base = AutoModelForCausalLM.from_pretrained(base_dir).eval()
    return ComposedMoEModel.from_adapter_dirs(base, [adapters[n] for n in NAMES], names=NAMES)


def run(config: GateGRPOConfig, model: ComposedMoEModel, store=None, prefix: str = "runs/r/moe/m", **kw):
    base_dir, adapters = toy_world()
    return train_gate_job(config, model, tiny_tokenizer(), capability_envs={n: ENVS[n] for n in NAMES},
                          adapter_uris={n: str(adapters[n]) for n in NAMES}, base_model=str(base_dir), store=store,
                          prefix=prefix, **kw)


def rewards(model: ComposedMoEModel) -> dict[str, float]:
    return {n: mean_reward(model.base, tiny_tokenizer(), n, EVAL_SEEDS) for n in NAMES}


def test_warm_start_then_grpo_routes_each_environment_to_its_adapter(tmp_path):
    model = composed()
    with torch.no_grad():
        for gate in model.gates:
            gate.weight.zero_()
            gate.bias.zero_()
    before = rewards(model)
    events: list[tuple[str, dict]] = []
    config = GateGRPOConfig(**dict(FAST, warm_start_episodes=16, warm_start_steps=300, warm_start_learning_rate=1e-2,
                                   max_steps=5, learning_rate=1e-2))
    result = run(config, model, open_store((tmp_path / "s").as_uri()),
                 on_event=lambda kind, payload: events.append((kind, payload)))
    after = rewards(model)
    assert before["late"] <= 0.1                                   # zero gates: the base, wrong on `late`
    assert after["late"] >= 0.9 and after["early"] >= 0.9, (before, after)
    its = [p for k, p in events if k == "iteration"]
    assert [p["iteration"] for p in its] == [0, 1, 2, 3, 4, 5]        # 0 = the warm start's summary
    assert its[0]["values"]["routing_accuracy"] >= 0.6
    for p in its[1:]:
        v = p["values"]
        assert {"reward_mean", "informative_group_fraction", "pass_rate", "rollouts_total"} <= set(v)
        assert abs(sum(v[f"routing_share_{n}"] for n in ["base", *NAMES]) - 1.0) < 1e-6
    # provenance (2 x 16) + 5 iterations x 2 groups x 4 episodes
    assert its[-1]["values"]["rollouts_total"] == 2 * 16 + 5 * 2 * 4
    kinds = {o["kind"] for o in result.outputs}
    assert {"composition", "gates"} <= kinds
    loaded = load_composition(result.composition.manifest_uri, cache_dir=tmp_path / "cache")
    for key, value in model.gate_state_dict().items():
        assert torch.equal(loaded.composed.gate_state_dict()[key], value), key


def test_only_gate_parameters_change_in_grpo():
    model = composed()
    base_before = {k: v.clone() for k, v in model.base.state_dict().items()}
    adapters_before = {k: v.clone() for k, v in model.routed.state_dict().items()}
    gates_before = model.gate_state_dict()
    run(GateGRPOConfig(**dict(FAST, warm_start_steps=0, max_steps=3, learning_rate=5e-2)), model)
    for key, value in model.base.state_dict().items():
        assert torch.equal(value, base_before[key]), key
    for key, value in model.routed.state_dict().items():
        assert torch.equal(value, adapters_before[key]), key
    changed = [k for k, v in model.gate_state_dict().items() if not torch.equal(v, gates_before[k])]
    assert changed, "GRPO did not move any gate"
    assert all(k.endswith(("weight", "bias")) for k in changed)


@pytest.mark.parametrize("warm_start_steps", [0, 20])
def test_resume_after_a_stop_reproduces_the_uninterrupted_run(tmp_path, warm_start_steps):
    config = GateGRPOConfig(**dict(FAST, warm_start_steps=warm_start_steps, max_steps=4, save_steps=1,
                                   learning_rate=5e-2, deterministic=True))
    straight = composed()
    full = run(config, straight, open_store((tmp_path / "a").as_uri()))
    store = open_store((tmp_path / "b").as_uri())
    seen = {"it": 0}

    def note(kind: str, payload: dict) -> None:
        if kind == "iteration":
            seen["it"] = payload["iteration"]

    first = run(config, composed(), store, should_stop=lambda: seen["it"] >= 2, on_event=note)  # "killed" after 2
    assert first.stopped_early and first.iterations < 4
    resumed_model = composed()
    second = run(config, resumed_model, store)
    assert second.iterations == 4 and not second.stopped_early
    for key, value in straight.gate_state_dict().items():
        assert torch.equal(resumed_model.gate_state_dict()[key], value), key
    assert [h["reward_mean"] for h in second.history] == [h["reward_mean"] for h in full.history]


@pytest.mark.parametrize("values, needle", [
    ({"lora_r": 4}, "lora_r"),
    ({"rollout_backend": "vllm", "vllm": {"base_url": "http://x:1/v1", "adapter_dir": "/a"}}, "in_process"),
    ({"max_steps": 0, "warm_start_steps": 0}, "train nothing"),
    ({"group_size": 4}, "num_generations"),
    ({"load_balancing_coef": -1}, "load_balancing_coef"),
    ({"target_fraction": 2}, "target_fraction"),
    ({"warm_start_tokens": "some"}, "warm_start_tokens"),
])
def test_config_validation_names_the_field(values, needle):
    with pytest.raises(InvalidArgument) as err:
        parse_config(values, GateGRPOConfig)
    assert needle in str(err.value)


@pytest.mark.parametrize("target_fraction, with_target, expected", [
    (0.5, True, {"early": 0.25, "late": 0.25, "target": 0.5}),
    (0.0, True, {"early": 0.5, "late": 0.5}),
    (0.8, False, {"early": 0.5, "late": 0.5}),
])
def test_mixture_draws_sources_by_weight_deterministically(target_fraction, with_target, expected):
    targets = [("target", ENVS["early"])] if with_target else []
    mixture = build_mixture({n: ENVS[n] for n in NAMES}, targets, target_fraction=target_fraction, split="train")
    picks = [mixture.pick(s)[0].label for s in range(4000)]
    assert [mixture.pick(s)[1] for s in range(50)] == [mixture.pick(s)[1] for s in range(50)]
    for label, share in expected.items():
        assert abs(picks.count(label) / len(picks) - share) < 0.03, (label, picks.count(label))
    assert set(picks) == set(expected)
    env = mixture.factory()
    obs = env.reset(7)
    assert env.episode_info()["mixture_source"] == mixture.pick(7)[0].label and obs.messages
