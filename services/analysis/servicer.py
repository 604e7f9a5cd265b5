"""AnalysisService gRPC servicer: proto <-> domain translation only."""

from __future__ import annotations

from trace_common.grpc import jobs_rpc
from trace_common.grpc.protoconv import parse
from trace_common.proto.trace.v1 import analysis_service_pb2 as pb
from trace_common.proto.trace.v1 import analysis_service_pb2_grpc as pb_grpc

from .service import Analyses
from .specs import AnalysisSpecModel


class AnalysisServicer(pb_grpc.AnalysisServiceServicer):
    def __init__(self, domain: Analyses):
        self.d = domain

    async def CreateAnalysisJob(self, request, context):
        spec = parse(AnalysisSpecModel, request.spec, "spec")
        rec = self.d.create_job(spec, request.run_id, dict(request.labels), request.request_id)
        return pb.CreateAnalysisJobResponse(job=jobs_rpc.job_to_proto(rec))

    async def GetAnalysisJob(self, request, context):
        return jobs_rpc.get(self.d.jobs, request, pb.GetAnalysisJobResponse)

    async def WatchAnalysisJob(self, request, context):
        async for msg in jobs_rpc.watch(self.d.jobs, request, pb.WatchAnalysisJobResponse):
            yield msg

    async def ListAnalysisJobs(self, request, context):
        return jobs_rpc.list_jobs(self.d.jobs, request, pb.ListAnalysisJobsResponse)

    async def CancelAnalysisJob(self, request, context):
        return jobs_rpc.cancel(self.d.jobs, request, pb.CancelAnalysisJobResponse)
