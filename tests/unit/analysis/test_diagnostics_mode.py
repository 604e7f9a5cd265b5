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


@pytest.mark.parametrize(("t", "label"), [
    (traj(events=[(CAP, "write_precondition_false")]), Label.LACKING),          # failure without metadata
    (traj(capability=CAP, events=[(CAP, "write_precondition_false")]), Label.LACKING),
    (traj(capability=CAP), Label.PRESENT),                                      # task needs it, no failure
    (traj(capabilities=("x_y", CAP)), Label.PRESENT),
    (traj(events=[(CAP, "capability_exercised")]), Label.PRESENT),              # explicit marker
    (traj(events=[(CAP, "capability_exercised"), (CAP, "write_precondition_false")]), Label.LACKING),
    (traj(capability="tool_call_precision", events=[("tool_call_precision", "malformed_argument")]), Label.NA),
    (traj(), Label.NA),
])
def test_label_rule(t, label):
    assert label_trajectory(t, [CAP])[CAP].label is label


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
