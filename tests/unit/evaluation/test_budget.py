"""TRACE's budget from synthetic stage records: every component counted (base rollouts with their
tokens, calibration episodes of every candidate and attempt, every adapter's and the gates' own
totals), jobs without totals counted from their config and marked, and a resumed run's records
(replayed last iteration, NaN for values that iteration did not measure, a manifest round trip)
accounted exactly as an uninterrupted run's. Then the GRPO budget curve's checkpoint points for a
budget list, and a real (tiny) GRPO run keeping exactly those checkpoints."""

from __future__ import annotations

import copy
import math

import pytest

from tests.unit.run.fakes import CAPS, report, stage_records
from trace_common.artifacts import open_store
from trace_common.errors import InvalidArgument
from tracectl.evaluation.budget import GatesCounts, GrpoCounts, calibration_episodes, trace_budget
from tracectl.evaluation.stage import curve_iterations
from tracectl.run.jobs import StageFailed
from tracectl.run.manifest import Manifest


def parsed(kind: str, config: dict) -> dict:
    """`config` as the trainer parses it (every default filled in), as the budget is given it."""
    from services.trainer.configs import validate_training_config

    return validate_training_config(kind, config, "config").model_dump(mode="json")


GRPO = GrpoCounts.model_validate(parsed("TRAINING_KIND_ADAPTER", {"max_steps": 5, "groups_per_batch": 2,
                                                                  "num_generations": 4}))
GATES = GatesCounts.model_validate(parsed("TRAINING_KIND_GATES", {
    "max_steps": 2, "groups_per_batch": 2, "num_generations": 4, "warm_start_steps": 10,
    "warm_start_labels": "provenance", "warm_start_episodes": 3}))
OUTCOME_GATES = GatesCounts.model_validate(parsed("TRAINING_KIND_GATES", {   # outcome labels, the default
    "max_steps": 2, "groups_per_batch": 2, "num_generations": 4, "warm_start_steps": 10, "warm_start_tasks": 4,
    "warm_start_samples_per_slot": 2}))


@pytest.mark.parametrize("rep, episodes, bound", [
    (report([[0.0, 1.0]] * 4), 8, 0),                                  # 4 groups x 2
    (report(None), 0, 0),                                              # rejected before calibrating
    # LLM retries: an attempt stopped by its oracle check never calibrated; one refused by the band did
    (report([[0.5] * 8] * 2, attempts=[["oracle: reward 0.4 on seed 3"], ["calibration: mean 0.9 outside"], []],
            groups=2, size=8), 16 + 16, 16),
    (report([[1.0] * 3], attempts=[["extract: the reply contains no ```python code block"], ["noop: too high"], []],
            groups=5, size=3), 3 + 15, 15),
    # library levels: each attempt recorded what its calibration played, so nothing is bounded
    (report([[1.0] * 4] * 2, attempts=[["calibration: mean 0.05 outside"]] * 2 + [[]], groups=2, size=4,
            counted=[8, 8, 8]), 8 + 16, 0),
    # a recorded 0 (stopped before calibrating) beside an unrecorded attempt that calibrated
    (report([[1.0] * 4], attempts=[["oracle: low"], ["calibration: mean 0.9 outside"], []], groups=1, size=4,
            counted=[0, None, 4]), 4 + 0 + 4, 4),
])
def test_calibration_episodes_of_one_candidate(rep, episodes, bound):
    out = calibration_episodes(rep)
    assert out.episodes == episodes and out.earlier_attempt_episodes_bound == bound


@pytest.mark.parametrize("kw, expected", [
    # everything reported: 6 base + 8 calibration + 40 + 48 adapters + 22 gates (6 of them provenance)
    ({}, {"total": 124, "rollout": 6, "calibration": 8, "adapters": 88, "gates": 22, "warm": 6, "grpo": 16,
          "prompt": 6 * 20 + 9000 + 900, "completion": 6 * 6 + 900 + 90, "estimated": False,
          "missing": ["calibration"]}),
    # an adapter job without totals (older trainer): max_steps x groups x generations = 5 x 2 x 4, marked
    ({"adapter_metrics": {CAPS[0]: {"rollouts_total": 40.0, "prompt_tokens_total": 4000.0,
                                    "completion_tokens_total": 400.0}, CAPS[1]: {"loss": 0.1}}},
     {"total": 6 + 8 + 40 + 40 + 22, "adapters": 80, "estimated": True, "missing": ["calibration", "adapters"]}),
    # gates without totals: provenance 2 adapters x 3 episodes + GRPO 2 x 2 x 4
    ({"gates_metrics": {}}, {"gates": 6 + 16, "warm": 6, "grpo": 16, "total": 6 + 8 + 88 + 22,
                             "labels": "provenance", "missing": ["calibration", "gates"]}),
    # ... with outcome labels: 4 tasks x (K+1 = 3) slots x 2 samples replayed + GRPO 2 x 2 x 4
    ({"gates_metrics": {}, "gates": OUTCOME_GATES}, {"gates": 24 + 16, "warm": 24, "grpo": 16, "labels": "outcome",
                                                      "total": 6 + 8 + 88 + 40}),
    # ... and reported totals: the job's own count whatever the config would estimate
    ({"gates": OUTCOME_GATES}, {"gates": 22, "warm": 6, "grpo": 16, "labels": "outcome"}),
    # every calibration candidate counts, rejected ones and earlier attempts included
    ({"reports": {CAPS[0]: report([[0.0, 1.0]] * 4), CAPS[1]: report([[0.0] * 8] * 16),
                  CAPS[2]: report([[0.2] * 2] * 2, attempts=[["calibration: low"], []], groups=2, size=2)}},
     {"calibration": 8 + 128 + 4 + 4, "total": 6 + 144 + 88 + 22}),
])
def test_budget_counts_every_component(tmp_path, kw, expected):
    store = open_store(tmp_path.as_uri())
    records = stage_records(store, **{k: v for k, v in kw.items() if k != "gates"})
    b = trace_budget(store, records.stages, lambda: GRPO, lambda: kw.get("gates", GATES))   # the run config's gates.config
    c = b.components
    got = {"total": b.total_episodes, "rollout": c["rollout"].episodes, "calibration": c["calibration"].episodes,
           "adapters": c["adapters"].episodes, "gates": c["gates"].episodes, "warm": c["gates"].warm_start_episodes,
           "grpo": c["gates"].grpo_episodes, "labels": c["gates"].warm_start_labels,
           "prompt": b.total_prompt_tokens,
           "completion": b.total_completion_tokens,
           "estimated": any(a.estimated for a in c["adapters"].per_adapter.values()),
           "missing": b.tokens_missing}
    assert {k: got[k] for k in expected} == expected
    assert b.total_episodes == sum(x.episodes for x in c.values())        # nothing outside the components
    assert b.training_episodes == c["adapters"].episodes + c["gates"].episodes
    assert c["calibration"].prompt_tokens is None   # the environment service reports no calibration tokens


def test_budget_of_a_resumed_run_equals_the_uninterrupted_one(tmp_path):
    """What a resumed run leaves in its records: the adapter job that was killed and resumed reports its
    last iteration again (same running totals, plus NaN for what that replay did not measure), other job
    ids, and the manifest went through JSON (NaN -> null) between attempts."""
    store = open_store(tmp_path.as_uri())
    straight = stage_records(store)
    resumed = copy.deepcopy(straight)
    metrics = resumed.stages["adapters"].result["metrics"]
    metrics[CAPS[0]] = {**metrics[CAPS[0]], "loss": math.nan, "grad_norm": math.nan, "replayed": 1.0}
    resumed.stages["adapters"].jobs = ["adapter-job-2", "adapter-job-3"]
    resumed.stages["gates"].result["metrics"]["warm_start_loss"] = math.nan
    resumed.save(store)
    reloaded = Manifest.load(store, "b")
    assert reloaded.stages["adapters"].result["metrics"][CAPS[0]]["loss"] is None   # the round trip under test
    a = trace_budget(store, straight.stages, lambda: GRPO, lambda: GATES)
    assert trace_budget(store, resumed.stages, lambda: GRPO, lambda: GATES) == a == \
        trace_budget(store, reloaded.stages, lambda: GRPO, lambda: GATES)


def test_budget_refuses_what_it_cannot_count(tmp_path):
    store = open_store(tmp_path.as_uri())
    m = stage_records(store)
    store.delete(f"runs/b/environments/{CAPS[0]}/validation.json")
    with pytest.raises(StageFailed, match="calibration episodes cannot be counted"):
        trace_budget(store, m.stages, lambda: GRPO, lambda: GATES)


# -- the GRPO budget curve's points ----------------------------------------------------------------
@pytest.mark.parametrize("multiples, budget, grpo, expected", [
    ([0.5, 1.0, 2.0, 4.0], 1280, {"groups_per_batch": 4, "num_generations": 8}, {0.5: 20, 1.0: 40, 2.0: 80, 4.0: 160}),
    ([0.5, 1.0, 2.0, 4.0], 1281, {"groups_per_batch": 4, "num_generations": 8}, {0.5: 21, 1.0: 41, 2.0: 81, 4.0: 161}),
    ([0.5, 1.0], 226, {"groups_per_batch": 2, "num_generations": 4}, {0.5: 15, 1.0: 29}),   # 14.1 -> 15, 28.3 -> 29
    ([1.0], 10, {}, {1.0: 1}),                                      # the parsed defaults 4 x 8; at least one
    ([0.1, 1.0], 300, {"groups_per_batch": 10, "num_generations": 3}, {0.1: 1, 1.0: 10}),
])
def test_curve_iterations_for_a_budget_list(multiples, budget, grpo, expected):
    grpo = parsed("TRAINING_KIND_ADAPTER", grpo)
    got = curve_iterations(multiples, budget, grpo)
    assert got == expected
    per = grpo["groups_per_batch"] * grpo["num_generations"]
    for m, it in got.items():   # the first iteration whose nominal episodes reach m x budget
        assert it * per >= m * budget and (it == 1 or (it - 1) * per < m * budget)


@pytest.mark.parametrize("save_steps, checkpoint_at, expected", [
    (0, [1, 3, 5], [1, 3, 5, 6]),      # the points, and the last iteration
    (4, [1, 3], [1, 3, 4, 6]),         # the points besides every save_steps-th
    (2, [], [2, 4, 6]),                # save_steps alone misses odd points
])
def test_a_grpo_run_keeps_the_checkpoints_of_the_budget_points(tmp_path, save_steps, checkpoint_at, expected):
    from services.trainer.grpo import checkpoint as ckpt
    from services.trainer.grpo.config import GRPOConfig
    from services.trainer.grpo.session import make_trainer
    from tests.unit.trainer.grpo.helpers import PickEnv, tiny_model, tiny_tokenizer

    store = open_store(tmp_path.as_uri())
    cfg = GRPOConfig(max_steps=6, save_steps=save_steps, checkpoint_at=checkpoint_at, groups_per_batch=2,
                     num_generations=4, max_completion_length=3, seed=1, lora_r=4,
                     early_stop_uninformative_iterations=0)
    trainer = make_trainer(cfg, tiny_model(), tiny_tokenizer(), PickEnv, store=store, prefix="runs/r/adapters/t",
                           capability="t")
    trainer.train(write_adapter=False)
    assert [c.iteration for c in ckpt.list_checkpoints(store, "runs/r/adapters/t")] == expected


@pytest.mark.parametrize("values, message", [
    ({"max_steps": 4, "checkpoint_at": [2, 5]}, "checkpoint_at=\\[5\\]"),
    ({"max_steps": 4, "checkpoint_at": [0]}, "checkpoint_at=\\[0\\]"),
])
def test_checkpoint_points_outside_the_run_are_refused(values, message):
    from services.trainer.grpo.config import parse_config

    with pytest.raises(InvalidArgument, match=message):
        parse_config(values)


def test_checkpoint_points_arrive_as_struct_floats():
    from services.trainer.grpo.config import parse_config

    assert parse_config({"max_steps": 8.0, "checkpoint_at": [2.0, 8.0]}).checkpoint_at == [2, 8]



def test_a_run_whose_jobs_reported_their_totals_asks_the_trainer_nothing(tmp_path):
    """The parsed configs are asked for only to estimate (a job without totals) or for the warm-start
    labels of a run whose gates stage did not record them: an evaluation needs no trainer otherwise."""
    store = open_store(tmp_path.as_uri())
    m = stage_records(store)
    asked = []

    def ask(what, answer):
        return lambda: asked.append(what) or answer
    m.stages["gates"].result["warm_start_labels"] = "outcome"
    b = trace_budget(store, m.stages, ask("grpo", GRPO), ask("gates", GATES))
    assert (b.total_episodes, b.components["gates"].warm_start_labels, asked) == (124, "outcome", [])
    del m.stages["gates"].result["warm_start_labels"]            # a run from before it was recorded
    assert trace_budget(store, m.stages, ask("grpo", GRPO), ask("gates", GATES)).total_episodes == 124
    assert asked == ["gates"]                                    # for its labels only (provenance, here)
