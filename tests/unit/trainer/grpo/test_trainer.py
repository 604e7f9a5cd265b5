"""The training loop on real tiny models: what changes, what is written, how it stops."""

from __future__ import annotations

import json

import pytest
import torch
from peft import PeftModel

from services.trainer.grpo import checkpoint as ckpt
from services.trainer.grpo.config import GRPOConfig
from services.trainer.grpo.session import make_trainer
from tests.unit.trainer.grpo.helpers import PickEnv, ToolEnv, tiny_tokenizer, warm_model
from trace_common.artifacts import open_store
from trace_common.errors import Unavailable

PREFIX = "runs/r1/adapters/pick_skill"


def pick_config(**kw) -> GRPOConfig:
    base = dict(max_steps=3, groups_per_batch=4, num_generations=8, max_completion_length=4, learning_rate=5e-3,
                save_steps=0, guidance_fraction=0.0, seed=7, lora_r=4, lora_alpha=8)
    base.update(kw)
    return GRPOConfig(**base)


def test_only_lora_changes_and_base_is_bit_identical(tmp_path):
    model = warm_model("pick")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    store = open_store(tmp_path.as_uri())
    trainer = make_trainer(pick_config(), model, tiny_tokenizer(), PickEnv, store=store, prefix=PREFIX,
                           capability="pick_skill")
    lora_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
    result = trainer.train(resume=False)
    assert result.iterations == 3 and result.policy_version >= 1
    base_after = trainer.model.get_base_model().state_dict()
    for key, value in before.items():
        wrapped = key.replace(".weight", ".base_layer.weight") if key.replace(".weight", ".base_layer.weight") \
            in base_after else key
        assert torch.equal(base_after[wrapped], value), key  # bitwise
    changed = [n for n, p in trainer.model.named_parameters() if "lora_" in n and not torch.equal(p, lora_before[n])]
    assert changed and all("lora_" in n for n in changed)
    assert all(not p.requires_grad for n, p in trainer.model.named_parameters() if "lora_" not in n)


def test_final_adapter_is_peft_format_and_reloads_unchanged(tmp_path):
    store = open_store(tmp_path.as_uri())
    trainer = make_trainer(pick_config(max_steps=2), warm_model("pick"), tiny_tokenizer(), PickEnv, store=store,
                           prefix=PREFIX, capability="pick_skill")
    result = trainer.train(resume=False)
    assert result.adapter_prefix == f"{PREFIX}/v1"
    kinds = {o["kind"] for o in result.outputs}
    assert kinds == {"adapter", "adapter_config", "training_curve", "training_metrics", "training_summary"}
    adir = tmp_path / PREFIX / "v1"
    assert (adir / "training_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len((adir / "metrics.jsonl").read_text().splitlines()) == 2
    reloaded = PeftModel.from_pretrained(warm_model("pick"), str(adir))
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        a = trainer.model(input_ids=ids).logits
        b = reloaded(input_ids=ids).logits
    assert torch.equal(a, b)
    # a second training of the same capability gets the next version
    again = make_trainer(pick_config(max_steps=1), warm_model("pick"), tiny_tokenizer(), PickEnv, store=store,
                         prefix=PREFIX, capability="pick_skill").train(resume=False)
    assert again.adapter_prefix == f"{PREFIX}/v2"


@pytest.mark.parametrize("env_kwargs, n, reason", [
    ({"good": ""}, 2, "no informative group in the last 2 iterations"),   # constant reward 0
    ({"constant": 1.0}, 3, "last mean reward 1.000"),   # solved by every episode: nothing left to learn
])
def test_early_stop_when_no_group_is_informative(env_kwargs, n, reason):
    events = []
    trainer = make_trainer(pick_config(max_steps=10, early_stop_uninformative_iterations=n), warm_model("pick"),
                           tiny_tokenizer(), lambda: PickEnv(**env_kwargs),
                           on_event=lambda k, p: events.append((k, p)))
    result = trainer.train(resume=False, write_adapter=False)
    assert result.stopped_early and reason in result.stop_reason and result.iterations == n
    assert result.policy_version == 0
    fractions = [p["values"]["informative_group_fraction"] for k, p in events if k == "iteration"]
    assert fractions == [0.0] * n
    assert events[-1][0] == "stopped"


class BreakableStore:
    """A real file store that becomes unreachable on demand (as when MinIO goes down)."""

    def __init__(self, inner):
        self.inner = inner
        self.broken = False

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if callable(attr) and name.startswith(("put_", "get_", "list", "stat")):
            def call(*a, **kw):
                if self.broken:
                    raise Unavailable("artifact store unreachable: connection refused")
                return attr(*a, **kw)
            return call
        return attr


def test_store_unavailable_mid_run_fails_and_keeps_last_checkpoint(tmp_path):
    store = BreakableStore(open_store(tmp_path.as_uri()))

    def on_event(kind, payload):
        if kind == "checkpoint" and payload["iteration"] == 2:
            store.broken = True

    trainer = make_trainer(pick_config(max_steps=6, save_steps=2), warm_model("pick"), tiny_tokenizer(), PickEnv,
                           store=store, prefix=PREFIX, capability="pick_skill", on_event=on_event)
    with pytest.raises(Unavailable, match="unreachable"):
        trainer.train(resume=False)
    store.broken = False
    found = ckpt.list_checkpoints(store, PREFIX)
    assert [c.iteration for c in found] == [2]
    loaded = ckpt.load_checkpoint(store, found[-1].key)  # complete and verified
    assert loaded.state.iteration == 2 and loaded.state.seed_cursor == 8


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["importance_weighted", "exclude"])
def test_guided_rollouts_enter_the_loss_as_configured(mode):
    rows = []
    cfg = GRPOConfig(max_steps=2, groups_per_batch=3, num_generations=4, max_completion_length=24, max_turns=2,
                     learning_rate=1e-3, save_steps=0, guidance_fraction=0.5, guidance_mode=mode, seed=3)
    trainer = make_trainer(cfg, warm_model("tool"), tiny_tokenizer(), ToolEnv,
                           on_event=lambda k, p: rows.append(p["values"]) if k == "iteration" else None)
    trainer.train(resume=False, write_adapter=False)
    assert trainer.n_guided == 2
    assert all("guided_reward_mean" in r for r in rows)
    trained = [r for r in rows if "trained_episodes" in r]
    assert trained
    for r in trained:
        if mode == "importance_weighted":
            assert 0.0 < r["importance_weight_mean"] <= 1.0
            assert r["trained_episodes"] == r["groups_trained"] * 4
        else:
            assert "importance_weight_mean" not in r
            assert r["trained_episodes"] == r["groups_trained"] * 2  # the unguided half only


def test_metrics_are_reported_every_iteration():
    rows = []
    trainer = make_trainer(pick_config(max_steps=2, beta=0.05), warm_model("pick"), tiny_tokenizer(), PickEnv,
                           on_event=lambda k, p: rows.append(p) if k == "iteration" else None)
    trainer.train(resume=False, write_adapter=False)
    assert [r["iteration"] for r in rows] == [1, 2]
    need = {"reward_mean", "reward_std", "pass_rate", "informative_group_fraction", "clip_fraction", "kl", "entropy",
            "tokens_per_second", "step_seconds", "loss"}
    for r in rows:
        assert need <= set(r["values"]), need - set(r["values"])
        assert r["values"]["kl"] >= 0.0
    json.dumps(rows)  # plain floats: they travel as JSON events


class FailingPolicy:
    """A backend that is down: every batch raises (as an unreachable vLLM does)."""

    name, adapter = "down", None

    async def generate(self, requests):
        from trace_common.policy.errors import PolicyUnavailable

        raise PolicyUnavailable("connection refused", kind="connection")

    async def close(self):
        pass


def test_backend_down_fails_the_iteration_with_the_reason():
    from services.trainer.grpo.rollouts import PolicyRollouts

    trainer = make_trainer(pick_config(), warm_model("pick"), tiny_tokenizer(), PickEnv,
                           engine=PolicyRollouts(FailingPolicy()))
    with pytest.raises(Unavailable, match="connection refused"):
        trainer.train(resume=False, write_adapter=False)


def test_groups_with_a_failed_episode_are_not_trained_on():
    from services.trainer.grpo.rollouts import PolicyRollouts
    from trace_common.env import Termination

    class OneBrokenEpisode(PolicyRollouts):
        async def play(self, *a, **kw):
            trajs = await super().play(*a, **kw)
            trajs[0] = trajs[0].model_copy(update={"termination": Termination.POLICY_ERROR, "reward": 0.0,
                                                   "success": False})
            return trajs

    rows = []
    model = warm_model("pick")
    trainer = make_trainer(pick_config(max_steps=2, guidance_fraction=0.0), model, tiny_tokenizer(), PickEnv,
                           on_event=lambda k, p: rows.append(p["values"]) if k == "iteration" else None)
    trainer.engine = OneBrokenEpisode(trainer.engine.policy)
    trainer.train(resume=False, write_adapter=False)
    for r in rows:
        informative = round(r["informative_group_fraction"] * r["groups"])
        assert r["policy_errors"] == 1
        assert r["groups_trained"] <= min(informative, r["groups"] - 1)   # group 0 never trained on


def test_episodes_past_the_context_are_counted_and_trained_on():
    """An episode whose conversation outgrew the model's context is the agent's failure: counted in
    `context_exhausted`, not a policy error, and its group is trained on."""
    from services.trainer.grpo.rollouts import PolicyRollouts
    from trace_common.env import Termination

    class OneLongEpisode(PolicyRollouts):
        async def play(self, *a, **kw):
            trajs = await super().play(*a, **kw)
            trajs[0] = trajs[0].model_copy(update={"termination": Termination.CONTEXT_EXHAUSTED})
            return trajs

    rows = []
    trainer = make_trainer(pick_config(max_steps=2, guidance_fraction=0.0), warm_model("pick"), tiny_tokenizer(),
                           PickEnv, on_event=lambda k, p: rows.append(p["values"]) if k == "iteration" else None)
    trainer.engine = OneLongEpisode(trainer.engine.policy)
    trainer.train(resume=False, write_adapter=False)
    for r in rows:
        assert r["context_exhausted"] == 1 and r["policy_errors"] == 0
        assert r["groups_trained"] == round(r["informative_group_fraction"] * r["groups"])   # none dropped
