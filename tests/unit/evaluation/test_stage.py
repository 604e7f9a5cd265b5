"""The evaluation stage over stand-in services (tests/unit/run/fakes.py: real store, real units and
threads, fixed per-task outcomes): every arm on the same tasks and probes, the budget curve's
points from one GRPO run, TRACE routing paired with every other arm, arms run in parallel with
every unit recorded, a killed evaluation resumed to the same tables, and the soft-routing arm
failing clearly where the services lack the mode."""

from __future__ import annotations

import pytest

from tests.unit.run.fakes import CAPS, Boom, FakeEvalPipeline, stage_records
from trace_common.artifacts import open_store
from trace_common.stats import paired_comparison
from tracectl.evaluation.scoring import outcomes
from tracectl.evaluation.stage import curve_iterations, evaluate
from tracectl.run import routing
from tracectl.run.config import RunConfig
from tracectl.run.jobs import StageFailed
from tracectl.run.manifest import Manifest
from tracectl.run.report import write_report
from tracectl.run.results import EvaluationResult, ExpertUsage, RoutedExample, RoutedToken, dump

ARMS = ["base", "best_single", "grpo_target", "trace_routing", "trace_per_request", "trace_soft"]
GRPO = {"groups_per_batch": 2, "num_generations": 4, "max_steps": 3, "save_steps": 2}
TIMES = ("wall_seconds", "wall_seconds_total", "train_seconds")


@pytest.fixture(autouse=True)
def _no_inference(monkeypatch):
    """The routing statistics need the inference service: the stand-in records what it was asked."""
    asked = []

    def usage(stub, store, composition_uri, trajectories_uri, *, name):
        asked.append(trajectories_uri)
        return (ExpertUsage(experts=["base", *CAPS[:2]], rows={"precondition_check": [[2, 1, 1]]}, episodes=1),
                RoutedExample(experts=["base"], tokens=[RoutedToken(text="hi", expert_index=0, expert="base")]))
    monkeypatch.setattr(routing, "routing_usage", usage)
    return asked


def pipeline(root, **evaluation) -> FakeEvalPipeline:
    cfg = RunConfig(run_id="ev", training={"grpo": GRPO},
                    evaluation={"limit": 40, "dev_limit": 12, "probe_limit": 8, "grpo_budgets": [0.5, 1, 2],
                                "parallel": 2, "bootstrap_samples": 400, "arms": ARMS, **evaluation})
    store = open_store(root.as_uri())
    m = Manifest.load(store, "ev") or stage_records(store, "ev")
    m.save(store)
    p = FakeEvalPipeline(cfg=cfg, runner=None, store=store, manifest=m)
    return p


def timeless(value, root: str = ""):
    """`value` without wall-clock times (the only numbers two runs may differ in), artifact URIs
    relative to the store root `root`."""
    if isinstance(value, dict):
        return {k: timeless(v, root) for k, v in value.items() if k not in TIMES}
    if isinstance(value, list):
        return [timeless(v, root) for v in value]
    if isinstance(value, str) and root:
        return value.replace(root, "<root>")
    return value


def test_every_arm_on_the_same_tasks_with_probes_curve_and_paired_statistics(tmp_path, _no_inference):
    p = pipeline(tmp_path).setup()
    out = EvaluationResult.model_validate(evaluate(p)["result"])
    arms = out.arms
    assert list(arms) == ARMS                                             # the config's order
    assert {a.task_ids_sha256 for a in arms.values()} == {arms["base"].task_ids_sha256}
    for name, a in arms.items():
        assert a.episodes == 40 and len(a.outcomes) == 40, name
        assert a.probes.episodes == 8 and set(a.probes.by_probe) == set(CAPS), name
        assert set(a.breakdown) == set(CAPS), name                     # compound: per required capability
    # the budget: 124 episodes (fakes.stage_records); TRACE arms carry it, the base none
    assert out.budget.total_episodes == out.trace_budget_episodes == 124
    assert [arms[n].training_episodes for n in ("base", "trace_routing", "trace_per_request", "trace_soft")] == [
        0, 124, 124, 124]
    assert arms["best_single"].training_episodes == 6 + 8 + 88 + 2 * 12   # rollout, calibration, adapters, dev
    # the curve: one GRPO run to the largest point, checkpointed at each; x = the trainer's own count
    points = curve_iterations([0.5, 1.0, 2.0], 124, GRPO)
    assert points == {0.5: 8, 1.0: 16, 2.0: 31}
    train_calls = [c for c in p.calls if c == "GRPO on target tasks"]
    assert len(train_calls) == 1 and out.grpo_curve_training.checkpoint_at == [8, 16, 31]
    assert [(pt.multiple, pt.iteration, pt.training_episodes) for pt in out.grpo_curve] == [
        (0.5, 8, 64), (1.0, 16, 128), (2.0, 31, 248)]
    assert arms["grpo_target"].iteration == 16 and arms["grpo_target"].training_episodes == 128 >= 124
    assert arms["grpo_target"].probes is not None and out.grpo_curve_points["grpo_target@2x"].probes is None
    # paired: TRACE routing against every other arm and curve point, from the recorded outcomes
    vs = out.paired.vs
    assert set(vs) == set(ARMS[:3] + ARMS[4:]) | {"grpo_target@0.5x", "grpo_target@2x"}
    expect = paired_comparison(outcomes(arms["trace_routing"]), outcomes(arms["base"]), samples=400, seed=0)
    assert dump(vs["base"]) == expect and vs["base"].n == 40
    assert out.power.n == 40 and set(out.power.min_detectable) == {"0.1", "0.2", "0.3"}
    # the routing statistics read the TRACE arm's probe episodes (one capability each)
    assert _no_inference == [arms["trace_routing"].probes.uri]
    assert out.expert_usage.rows == {"precondition_check": [[2, 1, 1]]} and out.routed_example.tokens[0].text == "hi"


def test_arms_run_in_parallel_and_every_unit_is_recorded(tmp_path):
    p = pipeline(tmp_path, parallel=3).setup(delay_s=0.05)
    evaluate(p)
    assert p.max_in_flight >= 2
    stored = Manifest.load(p.store, "ev").stages["evaluation"].partial
    assert set(stored) == {f"{kind} {arm}" for arm in ARMS if arm != "grpo_target" for kind in ("arm", "probe")} | {
        f"dev {c}" for c in CAPS[:2]} | {"train grpo_target", "arm grpo_target@0.5x", "arm grpo_target",
                                         "probe grpo_target", "arm grpo_target@2x"}


@pytest.mark.parametrize("killed_in", ["eval trace_per_request", "eval grpo_target@2x", "probes best_single",
                                       "GRPO on target tasks"])
@pytest.mark.parametrize("parallel", [1, 3])
def test_a_killed_evaluation_resumes_to_the_same_tables(tmp_path, killed_in, parallel):
    straight = pipeline(tmp_path / "a", parallel=parallel).setup()
    want = evaluate(straight)

    first = pipeline(tmp_path / "b", parallel=parallel).setup(fail_on={killed_in})
    with pytest.raises(Boom):
        evaluate(first)
    done = set(first.manifest.stages["evaluation"].partial)
    again = pipeline(tmp_path / "b", parallel=parallel).setup()   # a new process: the manifest from the store
    got = evaluate(again)
    assert timeless(got, again.store.root_uri) == timeless(want, straight.store.root_uri)
    # nothing finished before the kill was played again
    replayed = {c.replace("eval ", "arm ").replace("probes ", "probe ").replace("GRPO on target tasks",
                                                                               "train grpo_target")
                for c in again.calls}
    assert done and not replayed & done, replayed & done
    # and the report's tables are the same
    for p, res in ((straight, want), (again, got)):
        p.manifest.stages["evaluation"].result = timeless(res["result"])
    md = [write_report(p.cfg, p.manifest, p.store) and p.store.get_bytes("runs/ev/report/report.md").decode()
          for p in (straight, again)]
    assert md[0] == md[1]


def test_soft_routing_without_the_mode_fails_clearly_and_keeps_the_other_arms(tmp_path):
    p = pipeline(tmp_path, parallel=2).setup(soft_unsupported=True)
    with pytest.raises(StageFailed, match="soft_trajectory.*drop 'trace_soft'"):
        evaluate(p)
    stored = Manifest.load(p.store, "ev").stages["evaluation"].partial
    assert {"arm base", "arm trace_routing", "arm trace_per_request", "arm grpo_target"} <= set(stored)
    assert "arm trace_soft" not in stored


def test_arms_on_different_tasks_are_not_paired(tmp_path, monkeypatch):
    p = pipeline(tmp_path, arms=["base", "trace_routing"]).setup()
    real = p.rollout

    def fewer(policy, split, limit, *a, **kw):   # the base arm plays fewer tasks than TRACE
        return real(policy, split, 30 if not policy.composition_uri and split == "test" and limit == 40 else limit,
                    *a, **kw)
    monkeypatch.setattr(p, "rollout", fewer)
    with pytest.raises(StageFailed, match="played different tasks"):
        evaluate(p)


def test_several_trials_per_task_pair_tasks_not_episodes(tmp_path):
    """evaluation.trials = 3 (tau2's pass^k): every arm plays each test task 3 times, the outcomes are
    per-task success counts, the pairing is a sign-flip permutation over tasks, pass^1..pass^3 are
    kept, and the report says so."""
    from trace_common.stats import paired_trials_comparison, pass_hat_k
    from tracectl.evaluation.scoring import trial_successes

    p = pipeline(tmp_path, trials=3, temperature=0.7).setup()
    stored = evaluate(p)["result"]
    out = EvaluationResult.model_validate(stored)
    arms = out.arms
    for name, a in arms.items():
        assert (a.trials, a.tasks, a.episodes) == (3, 40, 120), name
        assert set(a.outcomes) <= set("0123") and len(a.outcomes) == 40, name
        counts = trial_successes(a)
        assert a.pass_rate == pytest.approx(sum(counts) / 120)
        assert a.pass_hat_k == {str(k): pass_hat_k(counts, 3, k) for k in (1, 2, 3)}
        assert a.pass_hat_k["3"] <= a.pass_hat_k["1"] == pytest.approx(a.pass_rate)
        assert a.probes.episodes == 8                                    # probes: one trial
    vs = out.paired.vs
    expect = paired_trials_comparison(trial_successes(arms["trace_routing"]), trial_successes(arms["base"]), 3,
                                      samples=400, seed=0)
    assert dump(vs["base"]) == expect
    assert vs["base"].test == "sign-flip permutation over tasks"
    assert out.power.trials == 3 and set(out.power.min_detectable_observed) == set(vs)
    with pytest.raises(ValueError, match="use trial_successes"):
        outcomes(arms["base"])
    p.manifest.stages["evaluation"].result = stored
    write_report(p.cfg, p.manifest, p.store)
    md = p.store.get_bytes("runs/ev/report/report.md").decode()
    assert "| base | " in md and "| 40 x 3 |" in md and "pass^3" in md and "permutation p" in md
    assert "40 paired tasks x 3 trials" in md
