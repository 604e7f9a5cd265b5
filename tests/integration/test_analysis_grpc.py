"""AnalysisService over real gRPC (the embedded stack on loopback): create, watch, get, files."""

import json

import pytest

from services.analysis.diagnostics_mode import label_trajectory
from tests.support.endpoints import allowed
from tests.unit.analysis.fixtures import EQUAL_GAP, PLANTED_RETAINED, RARE, planted_set, small_planted_set
from tests.unit.analysis.standin_llm import ScriptedAnalyst, StandinServer
from trace_common.artifacts import open_store
from trace_common.env import dumps_jsonl
from trace_common.grpc.client import messages, new_request_id
from trace_common.proto.trace.v1 import types_pb2 as t

pytestmark = pytest.mark.integration
A = messages("analysis")


def put_rollout(stack, run_id: str, trajectories) -> str:
    store = open_store(stack.root.resolve().as_uri())
    return store.put_bytes(f"runs/{run_id}/rollouts/part-000.jsonl", dumps_jsonl(trajectories)).uri


def watch_to_end(stub, job_id: str) -> list:
    return [m.job for m in stub.WatchAnalysisJob(A.WatchAnalysisJobRequest(job_id=job_id), timeout=120)]


def test_diagnostics_analysis_over_grpc(embedded_stack):
    stub = embedded_stack.stub("analysis")
    uri = put_rollout(embedded_stack, "grpc-diag", planted_set())
    created = stub.CreateAnalysisJob(A.CreateAnalysisJobRequest(
        spec=A.AnalysisSpec(rollout_uris=[uri], mode=A.ANALYST_MODE_DIAGNOSTICS), run_id="grpc-diag",
        request_id=new_request_id()))
    assert created.job.kind == "analysis" and created.job.run_id == "grpc-diag"
    seen = watch_to_end(stub, created.job.job_id)
    assert seen[-1].state == t.JOB_STATE_SUCCEEDED, seen[-1].error.message
    assert seen[-1].progress.stage == "done" and "2 of 4 capabilities retained" in seen[-1].progress.message

    got = stub.GetAnalysisJob(A.GetAnalysisJobRequest(job_id=created.job.job_id))
    assert got.mode == A.ANALYST_MODE_DIAGNOSTICS
    results = {r.capability.name: r for r in got.results}
    assert {n for n, r in results.items() if r.retained} == PLANTED_RETAINED
    assert results[EQUAL_GAP].rejection_reason == "gap" and results[RARE].rejection_reason == "coverage"
    kept = results["precondition_verification"]
    assert kept.passing_runs == 10 and kept.gap_mean == pytest.approx(1.0) and 0.3 < kept.coverage_mean < 0.5
    assert len(kept.capability.failed_task_ids) == 20 and kept.capability.evidence
    assert got.job.metrics["retained_capabilities"] == 2

    outputs = {o.uri.rsplit("/", 1)[1]: o for o in got.job.outputs}
    assert outputs["report.json"].kind == "analysis-report" and len(outputs["report.json"].sha256) == 64
    folder = embedded_stack.root / "runs" / "grpc-diag" / "analysis" / created.job.job_id
    for name in ("report.json", "report.md", "labels.jsonl", "delta_vs_coverage.png", "pass_matrix.png",
                 "lacking_rates.png"):
        assert (folder / name).is_file() and name in outputs
    assert "Analyst mode: diagnostics" in (folder / "report.md").read_text()
    # the failures no capability explains: the response carries report.json's counts
    u = json.loads((folder / "report.json").read_text())["unexplained_failures"]
    assert got.HasField("unexplained_failures")
    assert (got.unexplained_failures.failed, got.unexplained_failures.by_retained,
            got.unexplained_failures.by_candidates) == (u["retained"]["failed"], u["retained"]["unexplained"],
                                                        u["candidates"]["unexplained"])
    assert got.unexplained_failures.failed == sum(1 for x in planted_set() if not x.success)


def test_llm_analysis_over_grpc(embedded_stack):
    ts = small_planted_set()
    names = sorted(PLANTED_RETAINED) + [EQUAL_GAP, RARE]
    table = {x.task_id: {c: pl.label.value for c, pl in label_trajectory(x, names).items()} for x in ts}
    server = StandinServer(ScriptedAnalyst(table, [{"name": n, "description": f"skill {n}"} for n in names]))
    try:
        stub = embedded_stack.stub("analysis")
        uri = put_rollout(embedded_stack, "grpc-llm", ts)
        with allowed(embedded_stack, server.base_url, name="standin", services=("analysis",)):
            created = stub.CreateAnalysisJob(A.CreateAnalysisJobRequest(
                spec=A.AnalysisSpec(rollout_uris=[uri], mode=A.ANALYST_MODE_LLM, num_runs=3, min_passing_runs=3,
                                    llm=t.LlmEndpoint(profile="standin", model="standin")),
                run_id="grpc-llm", request_id=new_request_id()))
            final = watch_to_end(stub, created.job.job_id)[-1]
        assert final.state == t.JOB_STATE_SUCCEEDED, final.error.message
        assert final.progress.total == 3 * len(ts) * len(names) == final.progress.completed
        got = stub.GetAnalysisJob(A.GetAnalysisJobRequest(job_id=created.job.job_id))
        assert got.mode == A.ANALYST_MODE_LLM
        assert {r.capability.name for r in got.results if r.retained} == PLANTED_RETAINED
    finally:
        server.close()


def test_missing_rollout_fails_the_job_over_grpc(embedded_stack):
    stub = embedded_stack.stub("analysis")
    missing = (embedded_stack.root.resolve() / "runs" / "nope" / "rollouts" / "absent.jsonl").as_uri()
    created = stub.CreateAnalysisJob(A.CreateAnalysisJobRequest(
        spec=A.AnalysisSpec(rollout_uris=[missing], mode=A.ANALYST_MODE_DIAGNOSTICS), run_id="nope",
        request_id=new_request_id()))
    final = watch_to_end(stub, created.job.job_id)[-1]
    assert final.state == t.JOB_STATE_FAILED and final.error.code == "NOT_FOUND"
    assert "absent.jsonl" in final.error.message
    got = stub.GetAnalysisJob(A.GetAnalysisJobRequest(job_id=created.job.job_id))
    assert list(got.results) == [] and got.mode == A.ANALYST_MODE_UNSPECIFIED
