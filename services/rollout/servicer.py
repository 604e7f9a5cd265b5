"""RolloutService gRPC servicer: proto <-> domain translation only."""

from __future__ import annotations

from trace_common.grpc import jobs_rpc
from trace_common.grpc.protoconv import parse
from trace_common.proto.trace.v1 import rollout_service_pb2 as pb
from trace_common.proto.trace.v1 import rollout_service_pb2_grpc as pb_grpc

from .service import Rollouts
from .specs import RolloutSpecModel


class RolloutServicer(pb_grpc.RolloutServiceServicer):
    def __init__(self, domain: Rollouts):
        self.d = domain

    async def CreateRolloutJob(self, request, context):
        spec = parse(RolloutSpecModel, request.spec, "spec")
        rec = self.d.create_job(spec, request.run_id, dict(request.labels), request.request_id)
        return pb.CreateRolloutJobResponse(job=jobs_rpc.job_to_proto(rec))

    async def GetRolloutJob(self, request, context):
        return jobs_rpc.get(self.d.jobs, request, pb.GetRolloutJobResponse)

    async def WatchRolloutJob(self, request, context):
        async for msg in jobs_rpc.watch(self.d.jobs, request, pb.WatchRolloutJobResponse):
            yield msg

    async def ListRolloutJobs(self, request, context):
        return jobs_rpc.list_jobs(self.d.jobs, request, pb.ListRolloutJobsResponse)

    async def CancelRolloutJob(self, request, context):
        return jobs_rpc.cancel(self.d.jobs, request, pb.CancelRolloutJobResponse)

    async def ListRolloutEnvironments(self, request, context):
        return pb.ListRolloutEnvironmentsResponse(environments=[pb.EnvironmentInfo(**e) for e in self.d.environments()])
