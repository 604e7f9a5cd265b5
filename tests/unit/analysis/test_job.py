"""Analysis jobs end to end at the domain level (no gRPC): a real file artifact store in a temp
directory, the service's job manager, diagnostics mode. Known answers and bad input."""

import asyncio
import json
from pathlib import Path

import pytest

from services.analysis.metrics import CAPABILITIES, LABELS
from services.analysis.service import Analyses
from services.analysis.settings import AnalysisSettings
from services.analysis.specs import AnalysisSpecModel
from services.analysis.stats import Label, Thresholds, run_stats
from tests.unit.analysis.fixtures import EQUAL_GAP, PLANTED_RETAINED, RARE, make_trajectory, planted_set
from trace_common.artifacts import open_store
from trace_common.env import dumps_jsonl
from trace_common.jobs import JobState


def run_job(root: Path, data: bytes | None, *, key="runs/r1/rollouts/part-0.jsonl", run_id="r1",
            settings: dict | None = None, **spec):
    store = open_store(root.as_uri())
    uri = store.put_bytes(key, data).uri if data is not None else store.uri_for(key)
    spec = AnalysisSpecModel(rollout_uris=[uri], mode=spec.pop("mode", "ANALYST_MODE_DIAGNOSTICS"), **spec)

    async def go():
        domain = Analyses(AnalysisSettings(artifact_root=root.as_uri(), **(settings or {})))
        rec = domain.create_job(spec, run_id, {}, "")
        return await domain.jobs.wait(rec.job_id, timeout=120)
    return asyncio.run(go())


def report_files(root: Path, rec) -> dict[str, Path]:
    d = root / "runs" / rec.run_id / "analysis" / rec.job_id
    return {p.name: p for p in d.glob("*") if p.is_file() and not p.name.endswith(".sha256")
            and not p.name.startswith(".")} if d.is_dir() else {}


def test_known_answer_planted_deficits(tmp_path):
    lacking = LABELS.labels("LACKING", "diagnostics")._value.get()
    retained = CAPABILITIES.labels("retained")._value.get()
    rec = run_job(tmp_path, dumps_jsonl(planted_set()))
    assert rec.state == JobState.SUCCEEDED, rec.error_message
    result = rec.result
    assert result.mode == "diagnostics"
    assert {c.candidate.name for c in result.retained} == PLANTED_RETAINED
    reasons = {c.candidate.name: c.decision.rejection_reason for c in result.rejected}
    assert reasons == {EQUAL_GAP: "gap", RARE: "coverage"}
    for c in result.retained:
        assert c.decision.passing_runs == 10 and c.decision.gap_mean == pytest.approx(1.0)
        assert len(c.failed_task_ids) == 20 and len(c.evidence) == 5
    assert {o.kind for o in rec.outputs} == {"analysis-report", "analysis-report-markdown", "analysis-plot",
                                            "analysis-labels"}
    files = report_files(tmp_path, rec)
    assert set(files) == {"report.json", "report.md", "labels.jsonl", "delta_vs_coverage.png",
                          "pass_matrix.png", "lacking_rates.png"}
    for name in ("delta_vs_coverage.png", "pass_matrix.png", "lacking_rates.png"):
        assert files[name].read_bytes().startswith(b"\x89PNG")
    md = files["report.md"].read_text()
    assert "Analyst mode: diagnostics" in md and "| precondition_verification | retained | 10/10 |" in md
    report = json.loads(files["report.json"].read_text())
    assert report["status"] == "complete" and report["mode"] == "diagnostics"
    assert {c["name"] for c in report["retained"]} == PLANTED_RETAINED
    # Metrics: one LACKING per drawn (trajectory, capability) labeled LACKING, summed over runs.
    drawn_lacking = sum(r.n_lf + r.n_lp for c in result.capabilities for r in c.runs)
    assert LABELS.labels("LACKING", "diagnostics")._value.get() - lacking == drawn_lacking
    assert CAPABILITIES.labels("retained")._value.get() - retained == 2


def test_report_counts_trace_back_to_labels(tmp_path):
    """Every per-run count in report.json is recomputed from labels.jsonl."""
    rec = run_job(tmp_path, dumps_jsonl(planted_set()), num_runs=4, min_passing_runs=3)
    files = report_files(tmp_path, rec)
    report = json.loads(files["report.json"].read_text())
    lines = [json.loads(line) for line in files["labels.jsonl"].read_text().splitlines()]
    for cap in report["retained"] + report["rejected"]:
        for r, stats in enumerate(cap["runs"]):
            pairs = [(Label(x["labels"][cap["name"]]["label"]), x["success"])
                     for x in lines if x["run"] == r for _ in range(x["multiplicity"])]
            assert run_stats(pairs, Thresholds(num_runs=4, min_passing_runs=3)).to_dict() == stats
    # the failures no retained capability explains, by a majority of the runs that drew each
    retained = {c["name"] for c in report["retained"]}
    votes: dict[int, list[bool]] = {}
    for x in lines:
        if not x["success"]:
            votes.setdefault(x["index"], []).append(any(x["labels"][c]["label"] == "LACKING" for c in retained))
    unexplained = [i for i, v in sorted(votes.items()) if sum(v) * 2 <= len(v)]
    got = report["unexplained_failures"]["retained"]
    assert (got["failed"], got["unexplained"]) == (len(votes), len(unexplained))
    assert report["unexplained_failures"]["candidates"]["unexplained"] <= got["unexplained"]
    assert f"Failures no capability explains: {len(unexplained)} of {len(votes)} failed" in files["report.md"].read_text()


def test_known_answer_store_expert(tmp_path):
    """The built-in store domain's scripted expert with two planted partial gaps."""
    from trace_common.domains.store import ExpertConfig, StoreEnv, StoreExpert

    skills = {"precondition_verification": 0.2, "structured_data_reasoning": 0.2,
              "multi_step_task_completion": 1.0, "tool_call_precision": 1.0}
    expert, env = StoreExpert(ExpertConfig(skills=skills, seed=3)), StoreEnv()
    trajectories = [expert.play(env, seed) for seed in range(1_000_000, 1_000_200)]
    rec = run_job(tmp_path, dumps_jsonl(trajectories))
    assert rec.state == JobState.SUCCEEDED, rec.error_message
    assert {c.candidate.name for c in rec.result.retained} == {"precondition_verification",
                                                              "structured_data_reasoning"}
    assert {c.decision.rejection_reason for c in rec.result.rejected} == {"coverage"}


def test_thresholds_come_from_the_spec(tmp_path):
    rec = run_job(tmp_path, dumps_jsonl(planted_set()), min_coverage=0.5, num_runs=5, min_passing_runs=5)
    assert rec.state == JobState.SUCCEEDED
    assert rec.result.retained == []
    assert {c.decision.rejection_reason for c in rec.result.rejected if c.candidate.name in PLANTED_RETAINED} \
        == {"coverage"}
    assert all(len(c.runs) == 5 for c in rec.result.capabilities)


def test_no_passed_trajectories_is_analysed_with_a_warning(tmp_path):
    ts = [make_trajectory(f"f{i}", success=False, capability="precondition_verification",
                          failures=("precondition_verification",) if i % 2 else ()) for i in range(20)]
    rec = run_job(tmp_path, dumps_jsonl(ts))
    assert rec.state == JobState.SUCCEEDED
    assert "no passed trajectories" in rec.result.warnings[0]
    (cap,) = rec.result.capabilities
    assert all(r.er_plus == 0.0 and r.n_p == 0 for r in cap.runs)


CORRUPT = dumps_jsonl([make_trajectory("1", success=False, capability="a_b")]) + b'{"task_id": "2"}\n'

BAD_INPUT = {
    "missing artifact": (None, {}, "NOT_FOUND", "part-0.jsonl"),
    "empty artifact": (b"", {}, "FAILED_PRECONDITION", "holds no trajectories"),
    "not a trajectory": (CORRUPT, {}, "DATA_LOSS", "part-0.jsonl:2: not a valid trajectory"),
    "no failures": (dumps_jsonl([make_trajectory(str(i), success=True, capability="a_b") for i in range(5)]), {},
                    "FAILED_PRECONDITION", "no failed trajectories"),
    "no diagnostics": (dumps_jsonl([make_trajectory(str(i), success=i % 2 == 0) for i in range(6)]), {},
                       "FAILED_PRECONDITION", "use ANALYST_MODE_LLM"),
}


BAD_INPUT["more bytes than a job reads"] = (dumps_jsonl(planted_set()), {"settings": {"max_rollout_bytes": 1000}},
                                             "RESOURCE_EXHAUSTED", "more than one analysis job reads (1,000: "
                                             "TRACE_ANALYSIS_MAX_ROLLOUT_BYTES)")


def test_a_repeated_rollout_uri_is_refused_by_the_spec():
    uri = "file:///data/runs/r1/rollouts/part-0.jsonl"
    other = "file:///data/runs/r1/rollouts/part-1.jsonl"
    assert AnalysisSpecModel(rollout_uris=[uri, other], mode="ANALYST_MODE_DIAGNOSTICS").rollout_uris == [uri, other]
    with pytest.raises(ValueError, match=r"rollout_uris\[2\] repeats rollout_uris\[0\] .*list each artifact once"):
        AnalysisSpecModel(rollout_uris=[uri, other, uri], mode="ANALYST_MODE_DIAGNOSTICS")


def test_two_spellings_of_one_rollout_artifact_are_refused(tmp_path):
    """A path and its file:// URI name one artifact: its trajectories would count twice in every rate."""
    from trace_common.errors import InvalidArgument

    store = open_store(tmp_path.as_uri())
    uri = store.put_bytes("runs/r1/rollouts/part-0.jsonl", dumps_jsonl(planted_set())).uri
    path = str(tmp_path / "runs/r1/rollouts/part-0.jsonl")
    spec = AnalysisSpecModel(rollout_uris=[uri, path], mode="ANALYST_MODE_DIAGNOSTICS")
    domain = Analyses(AnalysisSettings(artifact_root=tmp_path.as_uri()))
    with pytest.raises(InvalidArgument, match=r"spec.rollout_uris\[1\].*each artifact once"):
        domain.create_job(spec, "r1", {}, "")


@pytest.mark.parametrize("case", BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_fails_the_job_with_a_reason(tmp_path, case):
    data, spec, code, message = case
    rec = run_job(tmp_path, data, **spec)
    assert rec.state == JobState.FAILED
    assert rec.error_code == code and message in rec.error_message
    assert rec.result is None and rec.outputs == ()
    assert "report.json" not in report_files(tmp_path, rec)


def test_tampered_artifact_is_refused(tmp_path):
    store = open_store(tmp_path.as_uri())
    info = store.put_bytes("runs/r1/rollouts/part-0.jsonl", dumps_jsonl(planted_set()))
    path = tmp_path / "runs/r1/rollouts/part-0.jsonl"
    path.write_bytes(path.read_bytes().replace(b'"success":false', b'"success":true ', 1))
    rec = run_job(tmp_path, None)
    assert rec.state == JobState.FAILED and rec.error_code == "DATA_LOSS" and info.sha256 in rec.error_message
