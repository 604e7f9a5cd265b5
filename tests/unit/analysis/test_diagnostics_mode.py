"""Diagnostics mode: the documented label rule and the stratified bootstrap."""

import pytest

from services.analysis.diagnostics_mode import bootstrap_runs, candidates, has_diagnostics, label_trajectory
from services.analysis.stats import Label
from tests.unit.analysis.fixtures import make_trajectory
from trace_common.env.environment import Diagnostic

CAP = "precondition_verification"


def traj(capability=None, capabilities=(), events=(), success=False):
    t = make_trajectory("1", success=success, capability=capability, capabilities=capabilities)
    t.diagnostics = [Diagnostic(capability=c, event=e, turn=2, detail={"order_id": "#W1"}) for c, e in events]
    return t


SDR, MULTI = "structured_data_reasoning", "multi_step_task_completion"


@pytest.mark.parametrize(("t", "label"), [
    (traj(events=[(CAP, "write_precondition_false")]), Label.LACKING),          # failure without metadata
    (traj(capability=CAP, events=[(CAP, "write_precondition_false")]), Label.LACKING),
    (traj(capability=CAP), Label.PRESENT),                                      # task needs it, no failure
    (traj(capabilities=("x_y", CAP)), Label.PRESENT),
    (traj(events=[(CAP, "capability_exercised")]), Label.PRESENT),              # explicit marker
    (traj(events=[(CAP, "capability_exercised"), (CAP, "write_precondition_false")]), Label.LACKING),
    (traj(capability="tool_call_precision", events=[("tool_call_precision", "malformed_argument")]), Label.NA),
    (traj(), Label.NA),
    # the case: a failed compound task whose only event is the sub-goal attribution
    (traj(capabilities=(CAP, SDR), events=[(CAP, "subgoal_failed")]), Label.LACKING),
    (traj(capabilities=(CAP, SDR), events=[(SDR, "subgoal_failed")]), Label.PRESENT),   # needed, not the failure
    (traj(capabilities=(SDR, MULTI), events=[(SDR, "subgoal_failed")]), Label.NA),      # not needed, not seen
    (traj(capabilities=(SDR,), events=[(CAP, "subgoal_failed")]), Label.LACKING),       # fallback tag
    (traj(capabilities=(CAP,), events=[(SDR, "unrequested_change")]), Label.PRESENT),
    (traj(capabilities=(CAP,), events=[(CAP, "unrequested_change")]), Label.LACKING),
    (traj(capabilities=(CAP,), success=True), Label.PRESENT),
    (traj(capabilities=(CAP,), success=True, events=[(CAP, "malformed_argument")]), Label.LACKING),  # recovered
])
def test_label_rule(t, label):
    assert label_trajectory(t, [CAP])[CAP].label is label


def test_subgoal_evidence_names_the_cause():
    t = traj(capabilities=(CAP,))
    t.diagnostics = [Diagnostic(capability=CAP, event="subgoal_failed", turn=7,
                                detail={"index": 1, "kind": "cancel_refused", "cause": "status_not_named"})]
    label = label_trajectory(t, [CAP])[CAP]
    assert label.label is Label.LACKING
    assert label.evidence.startswith("subgoal_failed at turn 7") and "status_not_named" in label.evidence


@pytest.mark.parametrize("missing", [SDR, MULTI, CAP, "tool_call_precision"])
def test_store_failures_are_lacking_for_the_missing_skill(missing):
    """Expert trajectories of the compound store target with one skill removed: every failed
    trajectory is LACKING for that skill, every passed one is not, and no failure is PRESENT
    for it (the analysis sees every failure)."""
    from trace_common.domains.store import CAPABILITIES, ExpertConfig, StoreEnv, StoreExpert

    skills = {c: 1.0 for c in CAPABILITIES} | {missing: 0.0}
    env, expert = StoreEnv(), StoreExpert(ExpertConfig(skills=skills))
    ts = [expert.play(env, seed) for seed in range(1_000_000, 1_000_060)]
    labels = [label_trajectory(t, list(CAPABILITIES)) for t in ts]
    assert any(not t.success for t in ts) and any(t.success for t in ts)
    for t, lab in zip(ts, labels, strict=True):
        assert (lab[missing].label is Label.LACKING) == (not t.success), t.seed
        for c in CAPABILITIES:
            if c != missing:
                assert lab[c].label is (Label.PRESENT if c in t.info["capabilities"] else Label.NA), (t.seed, c)


def test_lacking_evidence_quotes_the_event():
    t = traj(events=[(CAP, "write_precondition_false"), (CAP, "write_precondition_false")])
    ev = label_trajectory(t, [CAP])[CAP].evidence
    assert ev.startswith("write_precondition_false at turn 2 (+1 more)") and "#W1" in ev


def test_has_diagnostics():
    assert not has_diagnostics([traj(), traj(success=True)])
    assert has_diagnostics([traj(), traj(capability=CAP)])


def test_candidates_keep_the_most_failing_when_capped():
    ts = ([traj(events=[("a_a", "e")])] * 3 + [traj(events=[("b_b", "e")])] * 2 + [traj(events=[("c_c", "e")])]
          + [traj(capability="d_d", success=True)])
    assert [c.name for c in candidates(ts, 10)] == ["a_a", "b_b", "c_c", "d_d"]
    assert [c.name for c in candidates(ts, 2)] == ["a_a", "b_b"]
    assert "e (3)" in candidates(ts, 1)[0].description


def test_bootstrap_is_stratified_seeded_and_varied():
    ts = [traj(capability=CAP, success=i % 3 == 0) for i in range(30)]
    failed = {i for i, t in enumerate(ts) if not t.success}
    runs = bootstrap_runs(ts, [CAP], num_runs=10, seed=7)
    for run in runs:
        assert sum(i in failed for i in run.draws) == len(failed)        # |F| kept in every run
        assert len(run.draws) == len(ts)
        assert set(run.labels) == set(run.draws)
    assert len({tuple(r.draws) for r in runs}) == 10                      # runs differ
    assert [r.draws for r in bootstrap_runs(ts, [CAP], num_runs=10, seed=7)] == [r.draws for r in runs]
    assert [r.draws for r in bootstrap_runs(ts, [CAP], num_runs=10, seed=8)] != [r.draws for r in runs]
