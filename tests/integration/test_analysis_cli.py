"""`tracectl analyze` against an embedded stack started by the command itself."""

import json

import pytest

from services.analysis.diagnostics_mode import label_trajectory
from tests.unit.analysis.fixtures import (
    EQUAL_GAP,
    PLANTED_RETAINED,
    RARE,
    make_trajectory,
    planted_set,
    small_planted_set,
)
from tests.unit.analysis.standin_llm import ScriptedAnalyst, StandinServer
from trace_common.artifacts import open_store
from trace_common.env import dumps_jsonl, write_jsonl
from tracectl.cli import main

pytestmark = pytest.mark.integration
REPORT_FILES = {"report.json", "report.md", "labels.jsonl", "delta_vs_coverage.png", "pass_matrix.png",
                "lacking_rates.png"}


def analyze(capsys, *argv):
    code = main(["analyze", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_analyze_a_local_rollout_writes_the_report_to_the_run_directory(tmp_path, capsys):
    rollout = tmp_path / "rollout.jsonl"
    write_jsonl(planted_set(), rollout)
    root = tmp_path / "store"
    code, out, err = analyze(capsys, rollout, "--root", root, "--run-id", "cli-1", "--runs", "5",
                             "--min-passing-runs", "4", "--out", tmp_path / "copy")
    assert code == 0, err
    assert "analyst mode: diagnostics" in out
    for name in PLANTED_RETAINED:
        assert f"│ {name}" in out
    assert "rejected: gap" in out and "rejected: coverage" in out
    assert f"retained: {', '.join(sorted(PLANTED_RETAINED))}" in out
    (folder,) = (root / "runs" / "cli-1" / "analysis").iterdir()
    assert REPORT_FILES <= {p.name for p in folder.iterdir()}
    assert (root / "runs" / "cli-1" / "rollouts" / "rollout.jsonl.sha256").is_file()   # imported
    for name in REPORT_FILES:                                                          # --out copy, verified
        assert (tmp_path / "copy" / name).read_bytes() == (folder / name).read_bytes()
    assert json.loads((folder / "report.json").read_text())["config"]["num_runs"] == 5


@pytest.mark.parametrize(("stored_in", "imported"), [("other", True), ("cli-2", False)])
def test_a_stored_rollout_is_read_from_this_runs_rollouts(tmp_path, capsys, stored_in, imported):
    """The service reads only this run's rollouts: a store-written file of another run is copied
    (sha256-verified) into this run's first; one already there is read in place."""
    root = tmp_path / "store"
    info = open_store(root.as_uri()).put_bytes(f"runs/{stored_in}/rollouts/part-000.jsonl", dumps_jsonl(planted_set()))
    code, out, err = analyze(capsys, info.uri, "--root", root, "--run-id", "cli-2", "--runs", "5",
                             "--min-passing-runs", "4")
    assert code == 0, err
    assert ("imported" in err) is imported, err
    copy = root / "runs" / "cli-2" / "rollouts" / "part-000.jsonl"
    assert copy.read_bytes() == dumps_jsonl(planted_set())
    report = json.loads(next((root / "runs" / "cli-2" / "analysis").glob("*/report.json")).read_text())
    assert report["inputs"]["rollout_uris"] == [copy.as_uri()]


def test_analyze_in_llm_mode(tmp_path, capsys):
    ts = small_planted_set()
    names = sorted(PLANTED_RETAINED) + [EQUAL_GAP, RARE]
    table = {x.task_id: {c: pl.label.value for c, pl in label_trajectory(x, names).items()} for x in ts}
    server = StandinServer(ScriptedAnalyst(table, [{"name": n, "description": f"skill {n}"} for n in names]))
    try:
        write_jsonl(ts, tmp_path / "r.jsonl")
        code, out, err = analyze(capsys, tmp_path / "r.jsonl", "--root", tmp_path / "store", "--runs", "3",
                                 "--min-passing-runs", "3", "--llm-url", server.base_url, "--llm-model", "standin")
    finally:
        server.close()
    assert code == 0, err
    assert "analyst mode: llm" in out and "precondition_verification" in out
    (folder,) = (tmp_path / "store" / "analysis").iterdir()
    assert "Analyst mode: llm" in (folder / "report.md").read_text()


@pytest.mark.parametrize(("argv", "code", "message"), [
    (["{tmp}/absent.jsonl"], 2, "no such file"),
    (["{tmp}/r.jsonl", "--mode", "llm"], 2, "needs --llm-url and --llm-model"),
    # a spec the service refuses is bad usage too, its fields named by the flags that set them
    (["{tmp}/r.jsonl", "--runs", "3"], 2, "INVALID_ARGUMENT: spec: --min-passing-runs (8) exceeds --runs (3); "
                                          "lower --min-passing-runs or raise --runs"),
    (["{tmp}/r.jsonl", "--delta", "5"], 2, "INVALID_ARGUMENT: --delta: Input should be less than or equal to 1"),
    (["{tmp}/r.jsonl", "--rho", "-0.5"], 2, "INVALID_ARGUMENT: --rho: Input should be greater than or equal to 0"),
    (["{tmp}/r.jsonl", "--budget", "50"], 2, "--budget: --budget=50 is too small"),
    (["{tmp}/not-trajectories.jsonl"], 2, "line 1 is not a Trajectory record (task_id: Field required"),
    (["{tmp}/passed.jsonl"], 1, "FAILED_PRECONDITION no failed trajectories"),
])
def test_analyze_errors(tmp_path, capsys, argv, code, message):
    write_jsonl(planted_set()[:10], tmp_path / "r.jsonl")
    write_jsonl([make_trajectory(str(i), success=True, capability="a_b") for i in range(3)],
                tmp_path / "passed.jsonl")
    (tmp_path / "not-trajectories.jsonl").write_text('{"name": "x"}\n')
    got, out, err = analyze(capsys, *[a.format(tmp=tmp_path) for a in argv], "--root", tmp_path / "store")
    assert got == code and message in err, err
    assert "Traceback" not in out + err
