"""unexplained_failures: the failed trajectories none of the named capabilities explains, by a
majority of the runs that drew each one -- hand tables."""

from types import SimpleNamespace

import pytest

from services.analysis.labeling import LabelRun
from services.analysis.result import unexplained_failures
from services.analysis.schemas import PairLabel
from services.analysis.stats import Label

L, P, N = Label.LACKING, Label.PRESENT, Label.NA


def runs_of(*runs: dict[int, dict[str, Label]], draws: list[list[int]] | None = None) -> list[LabelRun]:
    out = []
    for r, labels in enumerate(runs):
        d = draws[r] if draws else sorted(labels)
        out.append(LabelRun(index=r, seed=r, draws=d,
                            labels={i: {c: PairLabel(lab, "") for c, lab in ls.items()} for i, ls in labels.items()}))
    return out


#: (case, successes per trajectory, runs, names, (failed, unexplained, task ids))
CASES = [
    ("lacking a named capability: explained", [False], runs_of({0: {"a": L, "b": P}}), ["a"], (1, 0, [])),
    ("lacking only an unnamed one: unexplained", [False], runs_of({0: {"a": P, "b": L}}), ["a"], (1, 1, ["t0"])),
    ("lacking nothing: unexplained", [False], runs_of({0: {"a": N, "b": P}}), ["a", "b"], (1, 1, ["t0"])),
    ("no capability named: every failure unexplained", [False, False], runs_of({0: {"a": L}, 1: {"a": L}}), [],
     (2, 2, ["t0", "t1"])),
    ("a passed trajectory is no failure", [True, False], runs_of({0: {"a": N}, 1: {"a": L}}), ["a"], (1, 0, [])),
    ("one of two runs: no majority, unexplained", [False], runs_of({0: {"a": L}}, {0: {"a": P}}), ["a"],
     (1, 1, ["t0"])),
    ("two of three runs: explained", [False], runs_of({0: {"a": L}}, {0: {"a": P}}, {0: {"a": L}}), ["a"],
     (1, 0, [])),
    # a bootstrap run drawing a trajectory twice votes once; one never drawn is not in F
    ("multiplicity and undrawn", [False, False, False],
     runs_of({0: {"a": L}, 1: {"a": P}}, {0: {"a": P}, 1: {"a": P}}, draws=[[0, 0, 1], [0, 1]]), ["a"],
     (2, 2, ["t0", "t1"])),
    ("nothing failed", [True], runs_of({0: {"a": P}}), ["a"], (0, 0, [])),
]


@pytest.mark.parametrize(("case", "successes", "runs", "names", "want"), CASES, ids=[c[0] for c in CASES])
def test_unexplained_failures(case, successes, runs, names, want):
    trajectories = [SimpleNamespace(success=s, task_id=f"t{i}") for i, s in enumerate(successes)]
    got = unexplained_failures(trajectories, runs, names)
    failed, unexplained, ids = want
    assert (got["failed"], got["unexplained"], got["task_ids"]) == (failed, unexplained, ids)
    assert got["share"] == pytest.approx(unexplained / failed if failed else 0.0)


def test_task_ids_are_bounded():
    trajectories = [SimpleNamespace(success=False, task_id=f"t{i}") for i in range(30)]
    got = unexplained_failures(trajectories, runs_of({i: {"a": P} for i in range(30)}), ["a"], max_ids=5)
    assert got["unexplained"] == 30 and got["task_ids"] == ["t0", "t1", "t2", "t3", "t4"]
