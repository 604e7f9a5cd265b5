"""AnalysisService gRPC servicer: proto <-> domain translation only."""

from __future__ import annotations

from trace_common.grpc import jobs_rpc
from trace_common.grpc.protoconv import parse
from trace_common.proto.trace.v1 import analysis_service_pb2 as pb
from trace_common.proto.trace.v1 import analysis_service_pb2_grpc as pb_grpc
from trace_common.proto.trace.v1 import types_pb2

from .result import AnalysisResult, CapabilityOutcome
from .service import Analyses
from .specs import AnalysisSpecModel

_MODE = {"llm": pb.ANALYST_MODE_LLM, "diagnostics": pb.ANALYST_MODE_DIAGNOSTICS}
#: Bounds on repeated fields in a response (the full lists are in report.json).
_MAX_IDS, _MAX_EVIDENCE = 100, 5


def capability_to_proto(o: CapabilityOutcome) -> pb.CapabilityResult:
    d = o.decision
    return pb.CapabilityResult(
        capability=types_pb2.Capability(name=o.candidate.name, description=o.candidate.description,
                                        evidence=o.evidence[:_MAX_EVIDENCE],
                                        failed_task_ids=o.failed_task_ids[:_MAX_IDS]),
        retained=d.retained, passing_runs=d.passing_runs, coverage_mean=d.coverage_mean,
        coverage_std=d.coverage_std, gap_mean=d.gap_mean, gap_std=d.gap_std,
        rejection_reason=d.rejection_reason)


def result_fields(result: AnalysisResult | None) -> dict:
    if result is None:
        return {}
    fields = {"results": [capability_to_proto(o) for o in result.capabilities], "mode": _MODE[result.mode]}
    if u := result.unexplained:
        fields["unexplained_failures"] = pb.UnexplainedFailures(
            failed=u["retained"]["failed"], by_retained=u["retained"]["unexplained"],
            by_candidates=u["candidates"]["unexplained"])
    return fields


class AnalysisServicer(pb_grpc.AnalysisServiceServicer):
    def __init__(self, domain: Analyses):
        self.d = domain

    async def CreateAnalysisJob(self, request, context):
        spec = parse(AnalysisSpecModel, request.spec, "spec")
        rec = self.d.create_job(spec, request.run_id, dict(request.labels), request.request_id)
        return pb.CreateAnalysisJobResponse(job=jobs_rpc.job_to_proto(rec))

    async def GetAnalysisJob(self, request, context):
        rec = self.d.jobs.get(request.job_id)
        return pb.GetAnalysisJobResponse(job=jobs_rpc.job_to_proto(rec), **result_fields(self.d.result(rec)))

    async def WatchAnalysisJob(self, request, context):
        async for msg in jobs_rpc.watch(self.d.jobs, request, pb.WatchAnalysisJobResponse):
            yield msg

    async def ListAnalysisJobs(self, request, context):
        return jobs_rpc.list_jobs(self.d.jobs, request, pb.ListAnalysisJobsResponse)

    async def CancelAnalysisJob(self, request, context):
        return jobs_rpc.cancel(self.d.jobs, request, pb.CancelAnalysisJobResponse)
