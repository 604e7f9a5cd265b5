"""Gate warm start from provenance: which positions carry a label, accuracy, slot 0 (the base),
gate-only updates, checkpoints and resume.

Threshold rationale (measured on the tiny world, see tests/unit/inference/tiny.py): labels sit only
on the positions that generate assistant tokens. Before training the seeded default gates send
~0.38 of those held-out (layer, position) decisions to the provenance slot; the warm start
reaches ~0.61 -- limited by layer 0, whose input is the token embedding alone, and the
replies of both capabilities share most tokens ("Order", the ids, JSON punctuation). The test holds
it at >= 0.5 and >= 0.12 above the untrained gates. Slot 0: with the base's own trajectories (a third
kind of conversation, `base_trajectories`) the gates route ~0.62 (adapters 0.12 / 0.27) of their held-out decisions
to slot 0; without them ~0.08.
"""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from services.trainer.gates.labelled_examples import provenance_examples
from services.trainer.gates.routing_report import routing_accuracy, routing_report
from services.trainer.gates.warm_start import GateTrainer, GateTrainingConfig, train_gates
from services.trainer.gates.warm_start_checkpoints import list_gate_checkpoints
from tests.unit.inference.tiny import CAPABILITIES, TOOLS, trajectories
from trace_common.artifacts import open_store
from trace_common.env.messages import Message, ToolCall
from trace_common.env.trajectory import EnvInfo, PolicyInfo, Trajectory
from trace_common.errors import FailedPrecondition, InvalidArgument
from trace_common.model_refs import UNCONFINED
from trace_common.moe import ComposedMoEModel
from trace_common.moe.composition_io import load_composition
from trace_common.policy.chat import ChatFormat

EXPERTS = ["base", *CAPABILITIES]
CONFIG = dict(max_steps=300, learning_rate=1e-2, per_device_train_batch_size=16, save_steps=0)


def base_trajectories(n: int, seed: int) -> list[Trajectory]:
    """The base agent's own successful target conversations: a third kind (stock questions), as the
    target's tasks differ from every capability environment's."""
    rng = random.Random(f"base:{seed}")
    out = []
    for i in range(n):
        item = rng.choice(["mugs", "lamps", "chairs"])
        msgs = [Message.system("You answer questions about stock."), Message.user(f"How many {item} are left?"),
                Message.assistant(f"There are {rng.randint(2, 9)} left in stock.")]
        out.append(Trajectory(task_id=f"base-{i}", seed=seed * 1000 + i, env=EnvInfo(name="target", version="1"),
                              policy=PolicyInfo(model="base"), messages=msgs, reward=1.0, success=True,
                              termination="done"))
    return out


def _model(world) -> ComposedMoEModel:
    base = AutoModelForCausalLM.from_pretrained(world.model_dir)
    return ComposedMoEModel.from_adapter_dirs(base, [world.adapter_dirs[c] for c in CAPABILITIES],
                                              names=list(CAPABILITIES))


def _examples(world, config: GateTrainingConfig, n: int = 16):
    provenance = {c: trajectories(c, n, seed=1) for c in CAPABILITIES}
    return provenance_examples(world.tokenizer, provenance, EXPERTS, config)


def test_warm_start_routes_heldout_positions_to_their_provenance_slot(world):
    config = GateTrainingConfig(**CONFIG)
    model = _model(world)
    trainer_examples = _examples(world, config)
    pad = world.tokenizer.pad_token_id
    from services.trainer.gates.labelled_examples import split_heldout

    _, heldout = split_heldout(trainer_examples, config.heldout_fraction, config.seed)
    before, _ = routing_accuracy(model, heldout, pad_id=pad)
    result = GateTrainer(model, trainer_examples, config, pad_id=pad).train()
    assert result.steps == 300
    assert result.heldout_accuracy >= 0.5, result.summary()
    assert result.heldout_accuracy >= before + 0.12, (before, result.summary())
    assert result.losses[-1] < result.losses[0]
    assert abs(sum(result.routing_share) - 1.0) < 1e-6


@pytest.mark.parametrize("with_base", [True, False])
def test_after_warm_start_slot0_wins_on_base_provenance_positions(world, with_base):
    """The known answer behind "slot 0 is never chosen": given the base's own trajectories, the gates
    route their held-out positions to slot 0 more than to any adapter; without them (slot 0 gets no
    examples, as before) slot 0 loses on the very same positions -- so this test fails if the base's
    provenance stops reaching slot 0."""
    config = GateTrainingConfig(**CONFIG)
    provenance = {c: trajectories(c, 16, seed=1) for c in CAPABILITIES}
    if with_base:
        provenance["base"] = base_trajectories(16, seed=1)
    examples = provenance_examples(world.tokenizer, provenance, EXPERTS, config)
    model = _model(world)
    result = GateTrainer(model, examples, config, pad_id=world.tokenizer.pad_token_id).train()
    held_base = provenance_examples(world.tokenizer, {"base": base_trajectories(8, seed=7)}, EXPERTS, config)
    report = routing_report(model, held_base, pad_id=world.tokenizer.pad_token_id)
    row = report.confusion[0]  # where the base's held-out decisions go, per slot
    if with_base:
        assert result.examples_per_slot[0] == 16 and result.heldout_accuracy_by_slot[0] is not None
        assert row[0] == max(row) and row[0] >= 0.5, row
    else:
        assert result.examples_per_slot[0] == 0 and result.heldout_accuracy_by_slot[0] is None
        assert row[0] <= 0.2, row


def _conversations() -> dict[str, tuple[list[Message], list]]:
    call = ToolCall.create("call_0_0", "refund_order", {"order_id": "A17"})
    return {
        "refunds": (trajectories("refunds", 1, seed=4)[0].messages, TOOLS["refunds"]),
        "addresses": (trajectories("addresses", 1, seed=4)[0].messages, TOOLS["addresses"]),
        "base": (base_trajectories(1, seed=4)[0].messages, []),
        "two_turns_two_tools": ([Message.system("You are the refunds desk of the store."),
                                 Message.user("Please refund order A17, it arrived late."),
                                 Message.assistant(None, [call]), Message.tool("call_0_0", '{"refunded": true}'),
                                 Message.user("And order B20?"), Message.assistant("Order B20 is refunded too.")],
                                TOOLS["refunds"]),
    }


@pytest.mark.parametrize("name", list(_conversations()))
def test_only_decisions_generating_assistant_tokens_are_labelled(world, name):
    """No position inside a system, user or tool message (or the tool schemas) carries a label; every
    position whose next token is part of an assistant reply does."""
    messages, tools = _conversations()[name]
    traj = Trajectory(task_id="t", seed=0, env=EnvInfo(name="e", version="1"), policy=PolicyInfo(model="m"),
                      messages=messages, reward=1.0, success=True, termination="done", tools=tools)
    (example,) = provenance_examples(world.tokenizer, {"refunds": [traj]}, EXPERTS, GateTrainingConfig())
    chat = ChatFormat(world.tokenizer)
    text, spans = chat.assistant_spans(messages, tools or None)
    offsets = world.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    segments = []  # (role, start, end) of each message's rendering (an assistant's includes its header)
    for i, msg in enumerate(messages):
        start = len(chat.render(messages[:i], tools or None, add_generation_prompt=False)) if i else 0
        segments.append((msg.role, start, len(chat.render(messages[:i + 1], tools or None,
                                                          add_generation_prompt=False))))
    in_reply = [any(s <= a < e for s, e in spans) for a, _ in offsets]
    labelled = [p for p, m in enumerate(example.label_mask) if m]
    assert labelled, "an assistant reply must give labelled positions"
    for p in labelled:
        role = next(r for r, s, e in segments if s <= offsets[p][0] < e)
        assert role == "assistant", (p, role, text[offsets[p][0]:offsets[p][1]])
    assert example.label_mask == [in_reply[p + 1] if p + 1 < len(in_reply) else False
                                  for p in range(len(example.token_ids))]
    assistants = sum(m.role == "assistant" for m in messages)
    assert sum(1 for p in labelled if not example.label_mask[p - 1]) == assistants  # one labelled run per reply


def test_only_gate_parameters_change(world):
    model = _model(world)
    frozen_before = {k: v.clone() for k, v in model.base.state_dict().items()}
    adapters_before = {k: v.clone() for k, v in model.routed.state_dict().items()}
    gates_before = model.gate_state_dict()
    config = GateTrainingConfig(**dict(CONFIG, max_steps=20))
    GateTrainer(model, _examples(world, config, n=6), config, pad_id=world.tokenizer.pad_token_id).train()
    for key, value in model.base.state_dict().items():
        assert torch.equal(value, frozen_before[key]), key
    for key, value in model.routed.state_dict().items():
        assert torch.equal(value, adapters_before[key]), key
    changed = [k for k, v in model.gate_state_dict().items() if not torch.equal(v, gates_before[k])]
    assert sorted(changed) == sorted(gates_before)
    assert not any(p.requires_grad for p in model.parameters())


def test_resume_continues_exactly(world, tmp_path):
    store = open_store((tmp_path / "store").as_uri())
    config = GateTrainingConfig(**dict(CONFIG, max_steps=12, save_steps=6, per_device_train_batch_size=4))
    pad = world.tokenizer.pad_token_id
    straight = _model(world)
    GateTrainer(straight, _examples(world, config, n=6), config, pad_id=pad).train(resume=False)

    first = _model(world)
    half = config.model_copy(update={"max_steps": 6})
    GateTrainer(first, _examples(world, half, n=6), half, pad_id=pad, store=store, prefix="runs/r/moe").train()
    assert [step for step, _ in list_gate_checkpoints(store, "runs/r/moe")] == [6]
    resumed_model = _model(world)
    result = GateTrainer(resumed_model, _examples(world, config, n=6), config, pad_id=pad, store=store,
                         prefix="runs/r/moe").train()
    assert result.resumed_from == 6 and result.steps == 12
    for key, value in straight.gate_state_dict().items():
        assert torch.equal(resumed_model.gate_state_dict()[key], value), key


@pytest.mark.parametrize("change, error", [
    ({"learning_rate": 0.5}, FailedPrecondition),
    ({"data_digest": "other-provenance"}, FailedPrecondition),
])
def test_resume_refuses_another_config(world, tmp_path, change, error):
    store = open_store((tmp_path / "store").as_uri())
    config = GateTrainingConfig(**dict(CONFIG, max_steps=2))
    pad = world.tokenizer.pad_token_id
    GateTrainer(_model(world), _examples(world, config, n=4), config, pad_id=pad, store=store, prefix="p").train()
    other = config.model_copy(update=change)
    with pytest.raises(error, match="another gate-training config"):
        GateTrainer(_model(world), _examples(world, other, n=4), other, pad_id=pad, store=store, prefix="p").train()


@pytest.mark.parametrize("config, needle", [
    ({"grpo_steps": 3}, "GateGRPOConfig.max_steps"),
    ({"grpo_steps": 0}, "grpo_steps: removed"),          # a removed field is refused at any value
    ({"tokens": "all"}, "assistant tokens"),
    ({"learning_rate": 0}, "greater than 0"),
    ({"heldout_fraction": 1.0}, "less than 1"),
])
def test_config_validation(config, needle):
    with pytest.raises(ValueError, match=needle):
        GateTrainingConfig(**config)


def test_provenance_with_unknown_capability_is_refused(world):
    with pytest.raises(InvalidArgument, match="capability names among"):
        provenance_examples(world.tokenizer, {"shipping": trajectories("refunds", 2, seed=0)}, EXPERTS,
                            GateTrainingConfig())


def test_train_gates_writes_a_loadable_composition(world, tmp_path):
    store = open_store((tmp_path / "store").as_uri())
    events = []
    result = train_gates(str(world.model_dir), {c: str(world.adapter_dirs[c]) for c in CAPABILITIES},
                         {c: trajectories(c, 8, seed=3) for c in CAPABILITIES}, dict(CONFIG, max_steps=40),
                         store=store, prefix="runs/r1/moe", cache_dir=tmp_path / "cache",
                         on_event=lambda kind, payload: events.append(kind), allowed=UNCONFINED)
    assert result.composition is not None
    manifest = result.composition.manifest
    assert manifest.training["steps"] == 40 and manifest.routing_share == result.routing_share
    loaded = load_composition(result.composition.manifest_uri, cache_dir=tmp_path / "cache", allowed=UNCONFINED)
    model = _model(world)
    # the stored gates are the trained ones: same held-out routing accuracy as reported
    model.load_gate_state_dict(loaded.composed.gate_state_dict())
    assert set(events) >= {"iteration", "checkpoint", "result", "composition"}
    assert list_gate_checkpoints(store, "runs/r1/moe")[-1][0] == 40


@pytest.mark.parametrize(("fields", "digest"), [
    ({}, "92a80cd3b12ac768"),                                # what a checkpoint written before grpo_steps was
    ({"learning_rate": 0.01, "init": "keep"}, "7090514be0e52ae1"),   # removed recorded: it still resumes
])
def test_checkpoint_digests_survive_the_removal_of_grpo_steps(fields, digest):
    assert GateTrainingConfig(**fields).digest() == digest
