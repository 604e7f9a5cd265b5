"""Outcome labels for the gate warm start (services.trainer.gates.outcomes): the labelling rule, the
replay tasks, the known answer on a toy target where the environment a task looks like is the wrong
adapter, and the budget (every replay, GRPO and re-collected episode counted).

The toy target `toy-crossed` (test_grpo_toy.py): seed % 3 picks an early, late or magic prompt, but an
early prompt scores an n-z reply (only adapter `late` says one) and a late prompt an a-m reply. Provenance
labels the early prompt with adapter `early` (its environment's prompt), outcome labels with the slot
that scored there. Measured (24 replay tasks, greedy replays, 300 warm-start steps at 3e-2, 1 thread):
the replays label 9 early-prompt tasks `late` (it alone scores), 6 magic tasks the base (alone) and 9
late-prompt tasks the base too (tied there with `early`: ties prefer the base); on the tasks where one slot alone scores
the gates then route every reply to it (hit rate 1.0) and score 1.0, and the held-out tasks of the test
split score 0.94 / 1.0 / 1.0 (early / late / magic prompts). Provenance labels on the same target: hit
rate 0.4 (the magic tasks only; every early-prompt task goes to `early`), 0.4 reward on those tasks,
0.0 / 0.0 / 1.0 held out. The test holds outcome labels to >= 0.9 and provenance labels to <= 0.5.
"""

from __future__ import annotations

import functools
from collections import Counter

import pytest
import torch
from transformers import AutoModelForCausalLM

from services.trainer.gates.config import GateGRPOConfig
from services.trainer.gates.labelled_examples import collate, provenance_examples
from services.trainer.gates.outcomes import label_task, outcome_table, replay_seeds
from services.trainer.gates.warm_start import GateTrainingConfig
from tests.unit.trainer.gates.test_grpo import (
    FAST,
    NAMES,
    Counting,
    _zero_gates,
    composed,
    for_labels,
    run,
)
from tests.unit.trainer.gates.test_grpo_toy import ENVS, play, toy_world
from tests.unit.trainer.grpo.conftest import _one_thread  # noqa: F401  (autouse: one thread, determinism)
from tests.unit.trainer.grpo.helpers import tiny_tokenizer
from trace_common.artifacts import open_store
from trace_common.env.trajectory import EnvInfo, PolicyInfo, Trajectory
from trace_common.errors import ArtifactCorrupted

SLOTS = ["base", *NAMES]
CROSSED = [("toy-crossed", ENVS["crossed"])]
OUTCOME = dict(FAST, warm_start_tasks=24, warm_start_temperature=0.0, warm_start_steps=300,
               warm_start_learning_rate=3e-2, max_steps=0)


def _t(reward: float, seed: int = 0, **breakdown: float) -> Trajectory:
    return Trajectory(task_id=str(seed), seed=seed, env=EnvInfo(name="toy-crossed", version="1.0.0"),
                      policy=PolicyInfo(model="m"), messages=[], reward=reward, success=reward == 1.0,
                      termination="done", reward_breakdown=breakdown)


# ---- the labelling rule ------------------------------------------------------------------------------------
@pytest.mark.parametrize("rewards, fallback, expect", [
    ([[0.0], [1.0], [0.0]], "", (1, "reward")),                 # one slot alone scores
    ([[1.0], [1.0], [0.0]], "", (0, "reward")),                 # tie with the base: the base
    ([[0.0], [1.0], [1.0]], "", (1, "reward")),                 # tie between adapters: the lowest index
    ([[0.0, 1.0], [1.0, 1.0], [1.0, 0.0]], "", (1, "reward")),  # the highest mean over the samples
    ([[0.0], [0.0], [0.0]], "", (None, "")),                    # no slot scores: no label
    ([[0.0], [0.0], [0.0]], "sub", (2, "fallback")),            # ... unless the fallback score separates them
    ([[0.0], [1.0], [0.0]], "sub", (1, "reward")),              # the fallback only where no reward scores
])
def test_label_task(rewards, fallback, expect):
    sub = {0: [0.2], 1: [0.4], 2: [0.6]}  # the fallback entry per slot and sample (0.5 where a sample is missing)
    per_slot = [[_t(r, **{"sub": sub[s][j] if j < len(sub[s]) else 0.5}) for j, r in enumerate(rs)]
                for s, rs in enumerate(rewards)]
    label, by, _means = label_task(per_slot, fallback)
    assert (label, by) == expect


@pytest.mark.parametrize("rewards, subs, ties, expect", [
    ([1.0, 1.0, 1.0], [0.5, 0.5, 0.5], "base", (0, "reward")),      # every slot scores the same: the base ...
    ([1.0, 1.0, 1.0], [0.5, 0.5, 0.5], "none", (None, "")),        # ... or, with ties none, no label
    ([0.0, 0.0, 0.0], [0.5, 0.5, 0.5], "base", (0, "fallback")),    # the same where the fallback decides
    ([0.0, 0.0, 0.0], [0.5, 0.5, 0.5], "none", (None, "")),
    ([1.0, 1.0, 0.0], [0.5, 0.5, 0.5], "none", (0, "reward")),      # a tie of some slots only still labels
    ([0.0, 1.0, 1.0], [0.5, 0.5, 0.5], "none", (1, "reward")),
    ([0.0, 0.0, 0.0], [0.2, 0.6, 0.6], "none", (1, "fallback")),
])
def test_a_task_every_slot_ties_on_is_labelled_by_warm_start_tie_label(rewards, subs, ties, expect):
    per_slot = [[_t(r, sub=sub)] for r, sub in zip(rewards, subs, strict=True)]
    label, by, _means = label_task(per_slot, "sub", ties)
    assert (label, by) == expect


def test_tie_label_none_relabels_stored_replays_and_changes_the_digest_only_when_set(tmp_path):
    from services.trainer.gates.outcomes import Outcomes, load_outcomes, outcomes_digest, save_outcomes
    from services.trainer.gates.provenance import PlayedBudget

    replays = {"base": [_t(0.0, 5, sub=0.5), _t(0.0, 6, sub=0.2)],     # task 5: every slot ties; task 6: "late"
               "early": [_t(0.0, 5, sub=0.5), _t(0.0, 6, sub=0.2)],
               "late": [_t(0.0, 5, sub=0.5), _t(0.0, 6, sub=0.4)]}
    store = open_store(f"file://{tmp_path}")
    for ties, labels in (("base", [0, 2]), ("none", [None, 2])):
        table, labelled = outcome_table(replays, SLOTS, [5, 6], samples=1, fallback="sub", ties=ties)
        assert [t.label for t in table] == labels
        save_outcomes(store, f"p-{ties}", Outcomes([5, 6], replays, table, labelled, PlayedBudget(episodes=6), "d"),
                      1, "sub", ties)
        assert [t.label for t in load_outcomes(store, f"p-{ties}").table] == labels   # reloaded: the same labels
    digests = {ties: outcomes_digest(GateGRPOConfig(**dict(OUTCOME, warm_start_tie_label=ties)), NAMES, ["t"])
               for ties in ("base", "none")}
    assert digests["base"] == outcomes_digest(GateGRPOConfig(**OUTCOME), NAMES, ["t"]) != digests["none"]


def test_stored_replays_without_a_tie_label_load_as_base_and_a_bad_one_is_refused(tmp_path):
    import json

    from services.trainer.gates.outcomes import Outcomes, load_outcomes, save_outcomes
    from services.trainer.gates.provenance import PlayedBudget

    replays = {name: [_t(0.0, 5, sub=0.5)] for name in SLOTS}          # one task, every slot tied
    table, labelled = outcome_table(replays, SLOTS, [5], samples=1, fallback="sub")
    assert table[0].tied and table[0].label == 0
    store = open_store(f"file://{tmp_path}")
    save_outcomes(store, "p", Outcomes([5], replays, table, labelled, PlayedBudget(episodes=3), "d"), 1, "sub")
    key = "p/outcomes/outcomes.json"
    for tie_label, expect in ((None, 0), ("none", None), ("adapter", ArtifactCorrupted)):
        record = json.loads(store.get_bytes(key))
        record.pop("tie_label", None)
        if tie_label is not None:
            record["tie_label"] = tie_label
        store.put_bytes(key, json.dumps(record).encode())
        if expect is ArtifactCorrupted:
            with pytest.raises(ArtifactCorrupted, match="tie_label 'adapter'"):
                load_outcomes(store, "p")
        else:
            loaded = load_outcomes(store, "p")
            assert [t.label for t in loaded.table] == [expect]
            assert loaded.summary(SLOTS)["tied_tasks"] == 1


@pytest.mark.parametrize("second, warm_starts_again", [
    ({}, False),                                   # the same config: GRPO resumes after the warm start it followed
    ({"warm_start_tie_label": "none"}, True),      # another tie rule: other labels, so warm-start again
    ({"warm_start_tasks": 5}, True),               # other replay tasks
    ({"warm_start_learning_rate": 1e-2}, True),    # the same data, another warm-start fit
])
def test_a_gate_job_rerun_with_other_warm_start_settings_warm_starts_again(tmp_path, second, warm_starts_again):
    store = open_store((tmp_path / "s").as_uri())
    first = dict(FAST, warm_start_tasks=6, warm_start_steps=5, max_steps=2, save_steps=1)
    run(GateGRPOConfig(**first), composed(), store, targets=CROSSED)
    counting = Counting()
    result = run(GateGRPOConfig(**{**first, **second}), composed(), store, targets=CROSSED, counting=counting)
    assert bool(result.warm_start) == warm_starts_again     # {}: resumed in GRPO, no warm start run
    replayed = {s for _, s in counting.resets} & set(replay_seeds(range(0, 1000), GateGRPOConfig(**{**first, **second})))
    assert bool(replayed) == (warm_starts_again and "warm_start_learning_rate" not in second)  # same data: reused


def test_outcome_table_labels_the_winners_own_best_samples_and_checks_the_replay_count():
    replays = {"base": [_t(0.0, 5), _t(0.0, 5), _t(1.0, 6), _t(0.0, 6)],  # 2 tasks x 2 samples, task-major
               "early": [_t(1.0, 5), _t(0.0, 5), _t(1.0, 6), _t(1.0, 6)],
               "late": [_t(0.0, 5), _t(0.0, 5), _t(0.0, 6), _t(0.0, 6)]}
    table, labelled = outcome_table(replays, SLOTS, [5, 6], samples=2)
    assert [(t.seed, t.label, t.rewards) for t in table] == [(5, 1, [0.0, 0.5, 0.0]), (6, 1, [0.5, 1.0, 0.0])]
    assert {k: [(t.seed, t.reward) for t in v] for k, v in labelled.items()} == {
        "early": [(5, 1.0), (6, 1.0), (6, 1.0)]}          # the winner's samples that scored its best
    with pytest.raises(ArtifactCorrupted, match="expected 2 tasks x 2 samples"):
        outcome_table({**replays, "late": replays["late"][:3]}, SLOTS, [5, 6], samples=2)


@pytest.mark.parametrize("tasks, max_steps, resample", [(24, 3, 2), (1000, 0, 0), (2000, 0, 0)])
def test_replay_tasks_are_the_end_of_grpos_schedule(tasks, max_steps, resample):
    from services.trainer.grpo.seeds import SeedSchedule

    config = GateGRPOConfig(**dict(FAST, warm_start_tasks=tasks, max_steps=max_steps, max_resample_rounds=resample))
    split = ENVS["crossed"]().splits()["train"]
    seeds = replay_seeds(split, config)
    assert len(seeds) == len(set(seeds)) == min(tasks, len(split)) and set(seeds) <= set(split)
    grpo_draws = SeedSchedule(split, config.seed).take(0, max_steps * config.groups_per_batch * (1 + resample))
    assert not set(seeds) & set(grpo_draws)
    assert seeds == replay_seeds(split, config)


# ---- the known answer: the gates choose the slot that scores -----------------------------------------------
@functools.lru_cache(maxsize=1)
def crossed_base_rollouts() -> tuple:
    """The plain base on 48 crossed training tasks at temperature 1 (provenance labels' slot 0)."""
    base_dir, _ = toy_world()
    model = AutoModelForCausalLM.from_pretrained(base_dir).eval()
    return tuple(play(model, tiny_tokenizer(), "crossed", range(0, 48), temperature=1.0, sampling_seed=7))


def _layer1_majority(model, trajectory: Trajectory) -> int:
    """The slot layer 1 (where the toy adapters act) routes most of a trajectory's reply-generating
    positions to, under the gates' own routing."""
    tok = tiny_tokenizer()
    examples = provenance_examples(tok, {"base": [trajectory]}, SLOTS, GateTrainingConfig())
    ids, attn, labels, _ = collate(examples, tok.pad_token_id, torch.device("cpu"))
    with torch.no_grad(), model.capture_routing() as trace:
        model(input_ids=ids, attention_mask=attn, use_cache=False)
    return int(torch.bincount(trace.experts()[1][labels], minlength=model.num_slots).argmax())


@pytest.mark.parametrize("labels, chosen", [("outcome", True), ("provenance", False)])
def test_after_the_outcome_warm_start_the_gates_choose_the_one_slot_that_scores(tmp_path, labels, chosen):
    model = composed()
    _zero_gates(model)
    config = GateGRPOConfig(**for_labels(OUTCOME, labels, episodes=16))
    result = run(config, model, open_store((tmp_path / "s").as_uri()), targets=CROSSED,
                 base=crossed_base_rollouts() if labels == "provenance" else ())
    # the outcome replays' target training tasks, for both labels (provenance labels replay none)
    seeds = replay_seeds(ENVS["crossed"]().splits()["train"], GateGRPOConfig(**OUTCOME))
    solo = []
    for slot in range(model.num_slots):   # each slot alone, greedy, as the replays play them
        with model.forced(slot):
            solo.append(play(model.base, tiny_tokenizer(), "crossed", seeds))
    alone = [(i, next(s for s in range(3) if solo[s][i].reward > 0)) for i in range(len(seeds))
             if sum(solo[s][i].reward > 0 for s in range(3)) == 1]
    assert Counter(w for _, w in alone) == {2: 9, 0: 6}, alone  # `late` on early prompts, the base on magic
    hit = sum(_layer1_majority(model, solo[w][i]) == w for i, w in alone) / len(alone)
    gated = play(model.base, tiny_tokenizer(), "crossed", [seeds[i] for i, _ in alone])
    reward = sum(t.reward for t in gated) / len(gated)
    if chosen:
        assert hit >= 0.9 and reward >= 0.9, (hit, reward)
        table = {row["seed"]: row["label"] for row in result.warm_start["outcomes"]["table"]}
        assert all(table[seeds[i]] == w for i, w in alone)      # the job's replays found the same winners
    else:
        assert hit <= 0.5 and reward <= 0.5, (hit, reward)      # provenance: the early prompt goes to `early`


# ---- budget: the episodes the job reports are the episodes it played ----------------------------------------
@pytest.mark.parametrize("labels, resample", [("outcome", 2), ("outcome", 0), ("provenance", 2)])
def test_the_gates_job_reports_every_episode_it_played(labels, resample):
    counting, events = Counting(), []
    config = GateGRPOConfig(**for_labels(dict(FAST, warm_start_tasks=6, warm_start_samples_per_slot=2,
                                              warm_start_steps=5, max_steps=3, max_resample_rounds=resample),
                                         labels))
    result = run(config, composed(), counting=counting, on_event=lambda k, p: events.append((k, p)))
    values = [p for k, p in events if k == "iteration"]
    warm_n = 6 * 3 * 2 if labels == "outcome" else 2 * config.warm_start_episodes
    assert values[0]["values"]["warm_start_rollouts"] == values[-1]["values"]["warm_start_rollouts"] == warm_n
    assert values[-1]["values"]["rollouts_total"] == len(counting.resets)          # replays + GRPO + re-collections
    assert len(counting.resets) == warm_n + sum(h["episodes"] for h in result.history)
    if resample:
        assert sum(h["resample_rounds"] for h in result.history) > 0
    if labels == "outcome":
        assert {label for label, _ in counting.resets} == {"toy-target"}         # no capability environment
        replays, grpo = counting.resets[:warm_n], counting.resets[warm_n:]
        assert {s for _, s in replays} == set(replay_seeds(range(0, 1000), config))
        assert not {s for _, s in replays} & {s for _, s in grpo}                 # disjoint tasks
        assert values[0]["values"]["outcome_tasks"] == 6


class _Unscored(ENVS["crossed"]):
    """The crossed target with no reward at all: what it would have scored is only a breakdown entry."""

    def reward(self) -> float:
        return 0.0

    def reward_breakdown(self) -> dict[str, float]:
        return {"sub": super().reward()}


@pytest.mark.parametrize("fallback", ["", "sub"])
def test_tasks_no_slot_scores_give_no_label_unless_a_fallback_score_separates_the_slots(fallback):
    model = composed()
    config = GateGRPOConfig(**dict(OUTCOME, warm_start_tasks=9, warm_start_steps=20, warm_start_fallback_score=fallback))
    events: list[tuple[str, dict]] = []
    result = run(config, model, targets=[("toy-crossed", _Unscored)], on_event=lambda k, p: events.append((k, p)))
    v = [p for k, p in events if k == "iteration"][0]["values"]
    assert v["rollouts_total"] == v["warm_start_rollouts"] == 9 * 3                  # replayed and counted either way
    if not fallback:
        assert v["outcome_labelled_tasks"] == 0 and v["warm_start_steps"] == 0      # nothing to fit ...
        assert all(not t.any() for t in model.gate_state_dict().values())         # ... gates zeroed: all to the base
        assert result.warm_start["skipped"]
    else:
        assert v["outcome_labelled_tasks"] == v["outcome_labelled_by_fallback"] == 9  # crossed: every task has a winner
        assert v["outcome_labels_late"] == 3 and v["warm_start_steps"] == 20


@pytest.mark.parametrize("breakdowns, fallback, scores", [
    ([{"sub": 0.5}, {"sub": 0.2}], "sub", [0.5, 0.2, 0.5]),
    ([{"sub": 0.5}, {}], "sub", [0.5, 0.0, 0.5]),    # missing on some episodes: 0 there (Semantics)
    ([{"credit": 0.5}, {"credit": 0.0}], "sub", None),  # on none: a misspelt or foreign key, refused
    ([{}, {}], "sub", None),
    ([{}, {}], "", []),                                # no fallback asked for: no label
])
def test_a_fallback_score_no_replay_reports_is_refused_by_name(breakdowns, fallback, scores):
    from trace_common.errors import InvalidArgument

    replays = {name: [_t(0.0, 5, **breakdowns[k % 2])] for k, name in enumerate(SLOTS)}
    if scores is None:
        seen = "credit" if breakdowns[0] else "none"
        with pytest.raises(InvalidArgument, match=rf"^warm_start_fallback_score: expected .*have {seen}\), got 'sub'"):
            outcome_table(replays, SLOTS, [5], samples=1, fallback=fallback)
    else:
        (row,), _ = outcome_table(replays, SLOTS, [5], samples=1, fallback=fallback)
        assert row.scores == scores and row.label == (0 if scores else None)


def test_a_fallback_score_the_target_never_reports_is_refused_before_the_adapters_replay():
    """The base's replays already show the target's breakdown keys: the adapters are not played."""
    from trace_common.errors import InvalidArgument

    config = GateGRPOConfig(**dict(OUTCOME, warm_start_tasks=3, warm_start_fallback_score="credit"))
    counting = Counting()
    with pytest.raises(InvalidArgument, match="warm_start_fallback_score"):
        run(config, composed(), targets=CROSSED, counting=counting)
    assert len(counting.resets) == 3            # the base's 3 replay episodes, no adapter's


@pytest.mark.parametrize("kind, values, same", [
    # float32: the digest commit 5028f1a (no dtype field) computed, so stored replays and provenance still serve
    ("outcome", {}, "a733e4c371b984c2"),
    ("outcome", {"dtype": "float32"}, "a733e4c371b984c2"),
    ("provenance", {"warm_start_labels": "provenance"}, "9ecd78e0a25b7381"),
    # played in bfloat16: other episodes, never the float32 ones (nor the warm start fitted to them)
    ("outcome", {"dtype": "bfloat16"}, None),
    ("provenance", {"warm_start_labels": "provenance", "dtype": "bfloat16"}, None),
])
def test_the_stored_warm_start_data_is_reused_only_at_the_precision_it_was_played_in(kind, values, same):
    from services.trainer.gates.outcomes import outcomes_digest
    from services.trainer.gates.provenance import provenance_digest

    config = GateGRPOConfig(**values)
    digest = outcomes_digest(config, ["a", "b"], ["store"]) if kind == "outcome" else \
        provenance_digest(config, ["a", "b"], [])
    old = {"outcome": "a733e4c371b984c2", "provenance": "9ecd78e0a25b7381"}[kind]
    assert (digest == old) is (same is not None)
