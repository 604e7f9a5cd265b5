"""Gate training as one job (services.trainer.gates.grpo): warm-start labels (outcome replays, the
default, tested in test_outcomes.py; here mostly provenance: adapters' episodes + the base's own target
trajectories for slot 0), warm start, then GRPO on the gates over the target's training tasks only, on
the toy world of test_grpo_toy.py (adapter `early` is right on early tasks, `late` on
late tasks, the plain base on magic tasks; the target mixes the three).

Measured on this toy (greedy reward per kind on 48 held-out target seeds, 1 thread): zero gates
(every token to the base) score early 1.0 / late 0.0 / magic 1.0. After the warm start with slot 0's
provenance (16 episodes per adapter, 16 of the base's 32 successful target trajectories, 600 steps at
3e-2) and 3 GRPO iterations at 3e-3: 1.0 / 1.0 / 1.0, with layer 1 routing 72% of the
reply-generating positions of the base's own magic replies to slot 0 (the rest to `early`). Without slot 0's provenance the warm start alone
gives 0.94 / 1.0 / 0.0: magic tasks go to an adapter, the gates never choose the base. (Seeds 1 and
2 of the job config give 1.0 / 1.0 / 1.0 too.) The held-out routing accuracy over both layers is low
here (~0.45): layer 0 reads only the token, and every reply is generated after the same header token.
GRPO on the gates at 1e-2 eroded the late tasks' routing margin within 3 iterations (late 0.0), and
GRPO alone did not raise the sampled reward measurably in 15 iterations of 4x8 episodes, so the
learning test holds the warm start to the known answer and GRPO to "trains only the gates and keeps
the warm-started routing's reward".
"""

from __future__ import annotations

import functools
from collections import Counter

import pytest
import torch
from transformers import AutoModelForCausalLM

from services.trainer.gates.config import _ONLY_FOR, GateGRPOConfig
from services.trainer.gates.grpo import train_gate_job
from services.trainer.gates.labelled_examples import collate, provenance_examples
from services.trainer.gates.mixture import build_mixture
from services.trainer.gates.provenance import select_base_provenance
from services.trainer.gates.warm_start import GateTrainingConfig
from services.trainer.grpo.config import parse_config
from tests.unit.trainer.gates.test_grpo_toy import ENVS, KINDS, base_rollouts, kind_rewards, toy_world
from tests.unit.trainer.grpo.helpers import tiny_tokenizer
from trace_common.artifacts import open_store
from trace_common.env.trajectory import EnvInfo, PolicyInfo, Trajectory
from trace_common.errors import FailedPrecondition, InvalidArgument
from trace_common.model_refs import UNCONFINED
from trace_common.moe.composed import ComposedMoEModel
from trace_common.moe.composition_io import load_composition

NAMES = ["early", "late"]
from tests.unit.trainer.grpo.conftest import _one_thread  # noqa: E402, F401  (autouse: one thread, determinism)

EVAL_SEEDS = range(1000, 1048)
TARGET = [("toy-target", ENVS["target"])]
FAST = dict(groups_per_batch=2, num_generations=4, max_completion_length=4, save_steps=0,
            early_stop_uninformative_iterations=0, guidance_fraction=0.0, max_resample_rounds=0)


def labels_config(labels: str, episodes: int = 8) -> dict:
    """The config fields of a warm start with `labels`; provenance labels with `episodes` per adapter
    (warm_start_episodes is a provenance field: under outcome labels the config refuses it)."""
    return {"warm_start_labels": labels, **({"warm_start_episodes": episodes} if labels == "provenance" else {})}


def for_labels(config: dict, labels: str, episodes: int = 8) -> dict:
    """`config` under warm-start `labels`: the other labels' fields dropped (the config refuses them:
    config._ONLY_FOR), `labels_config(labels, episodes)` added."""
    other = _ONLY_FOR["provenance" if labels == "outcome" else "outcome"]
    return {**{k: v for k, v in config.items() if k not in other}, **labels_config(labels, episodes)}


PROV = dict(FAST, **labels_config("provenance"))


def composed() -> ComposedMoEModel:
    base_dir, adapters = toy_world()
    base = AutoModelForCausalLM.from_pretrained(base_dir).eval()
    return ComposedMoEModel.from_adapter_dirs(base, [adapters[n] for n in NAMES], names=NAMES)


class Counting:
    """Environment factories that record every reset: (label, seed)."""

    def __init__(self) -> None:
        self.resets: list[tuple[str, int]] = []

    def wrap(self, label: str, cls):
        log = self.resets

        class Recorded(cls):
            def reset(self, seed):
                log.append((label, seed))
                return super().reset(seed)

        Recorded.__name__ = f"Recorded{cls.__name__}"
        return Recorded


def run(config: GateGRPOConfig, model: ComposedMoEModel, store=None, prefix: str = "runs/r/moe/m", *,
        counting: Counting | None = None, targets=TARGET, base=None, base_model: str | None = None, **kw):
    base_dir, adapters = toy_world()
    counting = counting or Counting()
    return train_gate_job(config, model, tiny_tokenizer(),
                          capability_envs={n: counting.wrap(n, ENVS[n]) for n in NAMES},
                          target_envs=[(label, counting.wrap(label, cls)) for label, cls in targets],
                          base_trajectories=base_rollouts() if base is None else base,
                          adapter_uris={n: str(adapters[n]) for n in NAMES}, base_model=base_model or str(base_dir),
                          store=store,
                          prefix=prefix, **kw)


def _zero_gates(model: ComposedMoEModel) -> None:
    with torch.no_grad():
        for gate in model.gates:
            gate.weight.zero_()
            gate.bias.zero_()


def slot_share_on_replies(model: ComposedMoEModel, trajectories, layer: int = 1) -> list[float]:
    """Share of layer `layer`'s decisions per slot over the labelled (reply-generating) positions of
    `trajectories`, under the gates' own routing. Layer 1 is where the toy adapters act."""
    cfg = GateTrainingConfig()
    examples = provenance_examples(tiny_tokenizer(), {"base": list(trajectories)}, ["base", *NAMES], cfg)
    ids, attn, labels, _ = collate(examples, tiny_tokenizer().pad_token_id, torch.device("cpu"))
    with torch.no_grad(), model.capture_routing() as trace:
        model(input_ids=ids, attention_mask=attn, use_cache=False)
    chosen = trace.experts()[layer][labels]  # [N]
    return (torch.bincount(chosen, minlength=model.num_slots).double() / chosen.numel()).tolist()


@pytest.mark.parametrize("with_base, grpo_steps", [(True, 3), (False, 0)])
def test_warm_start_routes_each_task_to_its_slot_and_slot0_needs_its_provenance(tmp_path, with_base, grpo_steps):
    model = composed()
    _zero_gates(model)
    before = kind_rewards(model.base, tiny_tokenizer(), EVAL_SEEDS)
    events: list[tuple[str, dict]] = []
    config = GateGRPOConfig(**dict(FAST, warm_start_episodes=16, warm_start_steps=600, warm_start_learning_rate=3e-2,
                                   max_steps=grpo_steps, learning_rate=3e-3, warm_start_labels="provenance"))
    result = run(config, model, open_store((tmp_path / "s").as_uri()), base=None if with_base else (),
                 on_event=lambda kind, payload: events.append((kind, payload)))
    after = kind_rewards(model.base, tiny_tokenizer(), EVAL_SEEDS)
    magic_base = [t for t in base_rollouts() if t.info["task_type"] == "magic" and t.success]
    magic_share = slot_share_on_replies(model, magic_base)  # the base's own successful magic replies
    its = [p for k, p in events if k == "iteration"]
    warm = its[0]["values"]
    assert before["late"] <= 0.1                                    # zero gates: the base, wrong on late tasks
    assert after["early"] >= 0.9 and after["late"] >= 0.9, (before, after)
    if with_base:
        assert warm["provenance_examples_base"] > 0 and "routing_accuracy_base" in warm
        assert magic_share[0] == max(magic_share) >= 0.6, magic_share  # slot 0 wins on its own replies (0.72)
        assert after["magic"] >= 0.9, (before, after)              # ... so the composition keeps the base there
    else:
        assert warm["provenance_examples_base"] == 0 and "routing_accuracy_base" not in warm
        assert magic_share[0] <= 0.1, magic_share                  # never routed to the base ...
        assert after["magic"] <= 0.15, (before, after)             # ... so an adapter answers, wrongly
    assert [p["iteration"] for p in its] == list(range(grpo_steps + 1))  # 0 = the warm start's summary
    for p in its[1:]:
        v = p["values"]
        assert {"reward_mean", "informative_group_fraction", "pass_rate", "rollouts_total"} <= set(v)
        assert abs(sum(v[f"routing_share_{n}"] for n in ["base", *NAMES]) - 1.0) < 1e-6
    # provenance (2 adapters x 16, played here) + every GRPO episode
    assert its[-1]["values"]["rollouts_total"] == 2 * 16 + sum(h["episodes"] for h in result.history)
    kinds = {o["kind"] for o in result.outputs}
    assert {"composition", "gates"} <= kinds
    loaded = load_composition(result.composition.manifest_uri, cache_dir=tmp_path / "cache", allowed=UNCONFINED)
    for key, value in model.gate_state_dict().items():
        assert torch.equal(loaded.composed.gate_state_dict()[key], value), key


@pytest.mark.parametrize("targets, resample", [
    (TARGET, 0),
    (TARGET, 2),                                                             # resampled groups: targets too
    ([("toy-target", ENVS["target"]), ("toy-target-b", ENVS["target"])], 0),  # several targets: a mixture
])
def test_gate_grpo_plays_only_target_training_tasks(targets, resample):
    counting = Counting()
    config = GateGRPOConfig(**dict(PROV, warm_start_steps=5, max_steps=3, max_resample_rounds=resample))
    result = run(config, composed(), counting=counting, targets=targets)
    by_label = Counter(label for label, _ in counting.resets)
    assert by_label["early"] == by_label["late"] == config.warm_start_episodes      # provenance only
    grpo = [(label, seed) for label, seed in counting.resets if label not in NAMES]
    assert len(grpo) == sum(h["episodes"] for h in result.history) > 0
    assert {label for label, _ in grpo} <= {label for label, _ in targets}
    assert all(seed in range(0, 1000) for _, seed in grpo)                        # the target's train split
    if resample:
        assert sum(h["resample_rounds"] for h in result.history) > 0


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


# ---- budget: a resumed job counts what an uninterrupted one does ----------------------------------------------
RESUME = dict(FAST, warm_start_steps=12, max_steps=4, save_steps=1, learning_rate=5e-2, deterministic=True,
              max_resample_rounds=1, warm_start_tasks=6)
TOTALS = ("rollouts_total", "prompt_tokens_total", "completion_tokens_total", "warm_start_rollouts")
WARM_EPISODES = {"outcome": 6 * 3, "provenance": 2 * 8}  # tasks x (K+1); K x warm_start_episodes


def _last_iteration(events: list[tuple[str, dict]]) -> dict[str, float]:
    return [p for k, p in events if k == "iteration"][-1]["values"]


@functools.lru_cache(maxsize=2)
def _uninterrupted(root: str, labels: str):
    events: list[tuple[str, dict]] = []
    model = composed()
    result = run(GateGRPOConfig(**for_labels(RESUME, labels)), model, open_store(root),
                 on_event=lambda k, p: events.append((k, p)))
    return result, _last_iteration(events), model.gate_state_dict()


STOPS = {  # when the first attempt is "killed": should_stop(events seen so far)
    "during_warm_start": lambda ev: any(k == "warm_start" and p["step"] >= 6 for k, p in ev),
    "after_warm_start": lambda ev: any(k == "iteration" for k, _ in ev),
    "mid_grpo": lambda ev: any(k == "iteration" and p["iteration"] >= 2 for k, p in ev),
    "finished": lambda ev: False,                      # the second attempt has nothing left to run
}


@pytest.mark.parametrize("labels", list(WARM_EPISODES))
@pytest.mark.parametrize("stop", list(STOPS))
def test_a_resumed_job_reports_the_budget_of_an_uninterrupted_one(tmp_path_factory, stop, labels):
    from services.trainer.gates.outcomes import replay_seeds

    config = GateGRPOConfig(**for_labels(RESUME, labels))
    reference, ref_last, ref_gates = _uninterrupted((tmp_path_factory.getbasetemp() / f"straight-{labels}").as_uri(),
                                                    labels)
    assert sum(h["resample_rounds"] for h in reference.history) > 0  # resampled groups are part of the count
    assert ref_last["rollouts_total"] == WARM_EPISODES[labels] + sum(h["episodes"] for h in reference.history)
    assert ref_last["prompt_tokens_total"] > 0 and ref_last["completion_tokens_total"] > 0
    store = open_store((tmp_path_factory.mktemp(f"{stop}-{labels}") / "s").as_uri())
    first_events: list[tuple[str, dict]] = []
    run(config, composed(), store, on_event=lambda k, p: first_events.append((k, p)),
        should_stop=lambda: STOPS[stop](first_events))
    counting, events = Counting(), []
    resumed_model = composed()
    second = run(config, resumed_model, store, counting=counting, on_event=lambda k, p: events.append((k, p)))
    last = _last_iteration(events)
    assert {k: last[k] for k in TOTALS} == {k: ref_last[k] for k in TOTALS}
    assert second.composition.manifest.training["rollouts_total"] == ref_last["rollouts_total"]
    assert not [r for r in counting.resets if r[0] in NAMES]  # no provenance episode played twice
    replays = set(replay_seeds(range(0, 1000), config))
    assert not [r for r in counting.resets if r[1] in replays]  # ... nor any outcome replay
    for key, value in ref_gates.items():
        assert torch.equal(resumed_model.gate_state_dict()[key], value), key


# ---- config, slot 0's provenance, the mixture ------------------------------------------------------------------
@pytest.mark.parametrize("values, needle", [
    ({"lora_r": 4}, "lora_r"),
    ({"rollout_backend": "vllm", "vllm": {"base_url": "http://x:1/v1", "adapter_dir": "/a"}}, "in_process"),
    ({"max_steps": 0, "warm_start_steps": 0}, "train nothing"),
    ({"group_size": 4}, "num_generations"),
    ({"load_balancing_coef": -1}, "load_balancing_coef"),
    ({"target_fraction": 0.5}, "target's training tasks only"),
    ({"warm_start_tokens": "all"}, "assistant tokens"),
    ({"warm_start_labels": "provenance", "base_provenance": "failed"}, "base_provenance"),
    ({"warm_start_labels": "provenance", "base_provenance_uris": ["runs/r/rollouts/t.jsonl"]}, "base_provenance_uris[0]"),
    ({"warm_start_labels": "soft"}, "warm_start_labels"),
    ({"warm_start_tasks": 0}, "warm_start_tasks"),
    ({"warm_start_samples_per_slot": 0}, "warm_start_samples_per_slot"),
    ({"warm_start_temperature": 0.0, "warm_start_samples_per_slot": 2}, "greedy"),
    ({"warm_start_fallback_score": "Sub Requests"}, "warm_start_fallback_score"),
    ({"warm_start_tie_label": "adapter"}, "warm_start_tie_label"),
    ({"max_resample_rounds": 17}, "max_resample_rounds"),
])
def test_config_validation_names_the_field(values, needle):
    with pytest.raises(InvalidArgument) as err:
        parse_config(values, GateGRPOConfig)
    assert needle in str(err.value)


@pytest.mark.parametrize("labels", [None, "outcome", "provenance"])   # None: the default, outcome
@pytest.mark.parametrize("field, value, only", [
    ("warm_start_episodes", 4, "provenance"),
    ("base_provenance", "all", "provenance"),
    ("base_provenance_uris", ["s3://trace/runs/r/rollouts/t.jsonl"], "provenance"),
    ("warm_start_tasks", 8, "outcome"),
    ("warm_start_samples_per_slot", 2, "outcome"),
    ("warm_start_temperature", 0.5, "outcome"),
    ("warm_start_fallback_score", "subrequests", "outcome"),
    ("warm_start_tie_label", "none", "outcome"),
])
def test_a_field_of_the_other_labels_is_refused(labels, field, value, only):
    values = {field: value, **({"warm_start_labels": labels} if labels else {})}
    if (labels or "outcome") == only:
        assert getattr(parse_config(values, GateGRPOConfig), field) == value
        return
    with pytest.raises(InvalidArgument) as err:   # inert under the other labels: refused, naming the field and the fix
        parse_config(values, GateGRPOConfig)
    assert f"{field}: {only} labels only" in str(err.value) and f"warm_start_labels: {only}" in str(err.value)


@pytest.mark.parametrize("labels", ["outcome", "provenance"])
def test_a_fully_dumped_config_parses_again(labels):
    """ValidateTrainingConfig answers with every default, and the worker re-parses the dumped config."""
    config = parse_config({"warm_start_labels": labels}, GateGRPOConfig)
    assert parse_config(config.model_dump(mode="json"), GateGRPOConfig) == config


@pytest.mark.parametrize("values, needle", [
    ({"warm_start_steps": 0, "max_steps": 2}, "target's training tasks only"),
    ({"warm_start_steps": 5, "max_steps": 0}, "replays every slot"),     # the outcome warm start needs it too
])
def test_gate_training_without_a_target_is_refused(values, needle):
    with pytest.raises(InvalidArgument, match=needle):
        run(GateGRPOConfig(**dict(FAST, **values)), composed(), targets=[])


def test_defaults_are_outcome_labels_and_three_recollection_rounds():
    config = GateGRPOConfig()
    assert (config.warm_start_labels, config.max_resample_rounds) == ("outcome", 3)


def _traj(seed: int, reward: float, env: str = "toy-target", termination: str = "done") -> Trajectory:
    return Trajectory(task_id=str(seed), seed=seed, env=EnvInfo(name=env, version="1.0.0"),
                      policy=PolicyInfo(model="base"), messages=[], reward=reward, success=reward == 1.0,
                      termination=termination)


BASE = [_traj(0, 1.0), _traj(1, 0.0), _traj(2, 1.0), _traj(3, 1.0), _traj(4, 0.0, termination="policy_error"),
        _traj(5, 1.0)]


@pytest.mark.parametrize("mode, episodes, trajectories, expect", [
    ("successful", 8, BASE, [0, 2, 3, 5]),                  # failures never label slot 0
    ("all", 8, BASE, [0, 1, 2, 3, 5]),                      # all but the cut-short episode
    ("none", 8, BASE, []),
    ("successful", 2, BASE, "two of the successful"),        # at most warm_start_episodes, a seeded choice
    ("successful", 8, [], []),                               # none given
    ("successful", 8, [_traj(1, 0.0)], FailedPrecondition),  # none succeeded: slot 0 would get nothing
    ("all", 8, [*BASE, _traj(1005, 1.0)], InvalidArgument),  # a held-out (test split) task
    ("all", 8, [*BASE, _traj(3, 1.0, env="toy-early")], InvalidArgument),  # another environment's episode
])
def test_slot0_provenance_selection(mode, episodes, trajectories, expect):
    config = GateGRPOConfig(**dict(FAST, **labels_config("provenance", episodes), base_provenance=mode))
    if isinstance(expect, type):
        with pytest.raises(expect):
            select_base_provenance(trajectories, TARGET, config)
        return
    got = [t.seed for t in select_base_provenance(trajectories, TARGET, config)]
    again = [t.seed for t in select_base_provenance(trajectories, TARGET, config)]
    assert got == again
    if isinstance(expect, str):
        assert len(got) == 2 and set(got) <= {0, 2, 3, 5} and got == sorted(got)
    else:
        assert got == expect


def test_mixture_of_target_environments_draws_each_equally_and_deterministically():
    targets = [("a", ENVS["target"]), ("b", ENVS["target"])]
    mixture = build_mixture(targets, split="train")
    picks = [mixture.pick(s)[0].label for s in range(4000)]
    assert [mixture.pick(s)[1] for s in range(50)] == [mixture.pick(s)[1] for s in range(50)]
    for label in ("a", "b"):
        assert abs(picks.count(label) / len(picks) - 0.5) < 0.03, (label, picks.count(label))
    env = mixture.factory()
    obs = env.reset(7)
    assert env.episode_info()["mixture_source"] == mixture.pick(7)[0].label and obs.messages
    assert obs.info["task_type"] in KINDS
    with pytest.raises(InvalidArgument, match="target environment"):
        build_mixture([], split="train")


def test_a_rerun_on_another_base_model_trains_its_gates_anew(tmp_path):
    """The gate job picks its GRPO checkpoint itself: one trained on another base model (a re-run of the
    run id with another base agent) is no continuation; it used to be resumed explicitly and then refused
    (FAILED_PRECONDITION on every retry)."""
    from services.trainer.grpo import checkpoint as ckpt

    config = GateGRPOConfig(**for_labels(RESUME, "outcome"))
    store = open_store((tmp_path / "s").as_uri())
    run(config, composed(), store)
    first = ckpt.latest_checkpoint(store, "runs/r/moe/m")
    assert first is not None and ckpt.read_record(store, first.key).model.endswith("base")
    base_dir, _ = toy_world()
    events: list[tuple[str, dict]] = []
    model = composed()
    train_gate_job(config, model, tiny_tokenizer(), capability_envs={n: ENVS[n] for n in NAMES},
                   target_envs=list(TARGET), base_trajectories=base_rollouts(),
                   adapter_uris={n: str(toy_world()[1][n]) for n in NAMES}, base_model=str(base_dir) + "-rebuilt",
                   store=store, prefix="runs/r/moe/m", on_event=lambda k, p: events.append((k, p)))
    # GRPO on the gates from its first iteration (iteration 0: the warm start's values)
    assert [p["iteration"] for k, p in events if k == "iteration"] == list(range(0, config.max_steps + 1))
    latest = ckpt.latest_checkpoint(store, "runs/r/moe/m")
    assert ckpt.read_record(store, latest.key).model == str(base_dir) + "-rebuilt"


def _retrained(model: ComposedMoEModel, name: str) -> ComposedMoEModel:
    """`model` with adapter `name`'s factors changed in place, as a retrained adapter written to the same
    URI would load: same name, same URI, other weights."""
    slot = model.adapter_names.index(name) + 1
    with torch.no_grad():
        for module in model.routed.values():
            if str(slot) in module.lora_B:
                module.lora_B[str(slot)].mul_(1.5)
    return model


@pytest.mark.parametrize("labels", ["outcome", "provenance"])
@pytest.mark.parametrize("change, replayed", [
    ("nothing", False),
    ("base model", True),
    ("adapter retrained at the same URI", True),
])
def test_warm_start_data_is_reused_only_for_the_same_models(tmp_path, labels, change, replayed):
    """The stored warm-start data (outcome replays, provenance episodes) is labels for the models that
    played it: a re-run under the prefix with another base model, or with an adapter retrained under
    the same name and URI, plays it again (it used to reuse the old models' episodes)."""
    from services.trainer.gates.outcomes import replay_seeds

    config = GateGRPOConfig(**for_labels(dict(RESUME, max_steps=0, warm_start_steps=4), labels))
    store = open_store((tmp_path / "s").as_uri())
    run(config, composed(), store)
    model = _retrained(composed(), "late") if change.startswith("adapter") else composed()
    counting = Counting()
    run(config, model, store, counting=counting,
        base_model=str(toy_world()[0]) + "-rebuilt" if change == "base model" else None)
    if labels == "outcome":
        replays = set(replay_seeds(range(0, 1000), config))
        played = [r for r in counting.resets if r[1] in replays]
    else:
        played = [r for r in counting.resets if r[0] in NAMES]
    assert bool(played) is replayed, played[:5]


@pytest.mark.parametrize("warm_start_steps", [0, 4])
@pytest.mark.parametrize("change, trained_anew", [
    ("nothing", False),
    ("adapter retrained at the same URI", True),
])
def test_gate_grpo_continues_only_checkpoints_of_the_same_composition(tmp_path, warm_start_steps, change,
                                                                     trained_anew):
    """A finished gate job re-run under its prefix continues its GRPO checkpoints (nothing left to run)
    only when the composition is the same; with an adapter retrained under the same name and URI the
    gates are trained anew, from GRPO's first iteration (they used to continue gates fitted to the old
    adapter when no warm start stood in between)."""
    config = GateGRPOConfig(**for_labels(dict(RESUME, warm_start_steps=warm_start_steps, max_steps=2), "outcome"))
    store = open_store((tmp_path / "s").as_uri())
    run(config, composed(), store)
    events: list[tuple[str, dict]] = []
    model = _retrained(composed(), "late") if change.startswith("adapter") else composed()
    run(config, model, store, on_event=lambda k, p: events.append((k, p)))
    played = [p["iteration"] for k, p in events if k == "iteration" and not p.get("replayed")]
    assert bool([i for i in played if i >= 1]) is trained_anew, events


@pytest.mark.parametrize("labels", ["outcome", "provenance"])
def test_warm_start_data_recorded_before_models_were_digested_is_still_reused(tmp_path, labels):
    """A record written before the models were part of the warm-start data's digest (its digest is the
    one without them) is reused, as it was then, rather than replayed by every resumed job."""
    import json

    from services.trainer.gates import outcomes as outcome_labels
    from services.trainer.gates import provenance as provenance_labels
    from services.trainer.gates.outcomes import outcomes_digest, replay_seeds
    from services.trainer.gates.provenance import provenance_digest

    config = GateGRPOConfig(**for_labels(dict(RESUME, max_steps=0, warm_start_steps=4), labels))
    store = open_store((tmp_path / "s").as_uri())
    run(config, composed(), store)
    where = (f"runs/r/moe/m/outcomes/{outcome_labels.RECORD_FILE}" if labels == "outcome"
             else f"runs/r/moe/m/provenance/{provenance_labels.RECORD_FILE}")
    record = json.loads(store.get_bytes(where))
    if labels == "outcome":
        record["digest"] = outcomes_digest(config, NAMES, [label for label, _ in TARGET])
    else:
        base = select_base_provenance(base_rollouts(), TARGET, config, None)
        record["digest"] = provenance_digest(config, NAMES, base)
    store.put_bytes(where, json.dumps(record, sort_keys=True).encode())
    counting = Counting()
    run(config, composed(), store, counting=counting)
    if labels == "outcome":
        replays = set(replay_seeds(range(0, 1000), config))
        assert not [r for r in counting.resets if r[1] in replays]
    else:
        assert not [r for r in counting.resets if r[0] in NAMES]


def test_gate_grpo_checkpoints_recorded_before_gate_model_keys_are_still_continued(tmp_path):
    """Gate checkpoints written before gate jobs recorded their composition's key (model_key "") are
    continued on their base model, as then: a resumed job does not lose its GRPO progress."""
    import json

    from services.trainer.grpo import checkpoint as ckpt

    config = GateGRPOConfig(**for_labels(dict(RESUME, warm_start_steps=0, max_steps=2), "outcome"))
    store = open_store((tmp_path / "s").as_uri())
    run(config, composed(), store)
    for found in ckpt.list_checkpoints(store, "runs/r/moe/m"):
        manifest = json.loads(store.get_bytes(found.key))
        manifest["identity"]["model_key"] = ""
        store.put_bytes(found.key, json.dumps(manifest).encode())
    events: list[tuple[str, dict]] = []
    run(config, composed(), store, on_event=lambda k, p: events.append((k, p)))
    assert not [p for k, p in events if k == "iteration" and not p.get("replayed") and p["iteration"] >= 1], events
