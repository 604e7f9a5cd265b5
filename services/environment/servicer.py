"""EnvironmentService gRPC servicer: proto <-> domain translation only."""

from __future__ import annotations

from trace_common.grpc import jobs_rpc
from trace_common.grpc.protoconv import parse
from trace_common.proto.trace.v1 import environment_service_pb2 as pb
from trace_common.proto.trace.v1 import environment_service_pb2_grpc as pb_grpc
from trace_common.specs import EnvironmentRefModel

from .service import Environments
from .specs import GenerationSpecModel


def _record(r: dict) -> pb.EnvironmentRecord:
    return pb.EnvironmentRecord(name=r["name"], version=r["version"], capability=r["capability"])


class EnvironmentServicer(pb_grpc.EnvironmentServiceServicer):
    def __init__(self, domain: Environments):
        self.d = domain

    async def CreateGenerationJob(self, request, context):
        spec = parse(GenerationSpecModel, request.spec, "spec")
        rec = self.d.create_job(spec, request.run_id, dict(request.labels), request.request_id)
        return pb.CreateGenerationJobResponse(job=jobs_rpc.job_to_proto(rec))

    async def GetGenerationJob(self, request, context):
        return jobs_rpc.get(self.d.jobs, request, pb.GetGenerationJobResponse)

    async def WatchGenerationJob(self, request, context):
        async for msg in jobs_rpc.watch(self.d.jobs, request, pb.WatchGenerationJobResponse):
            yield msg

    async def ListGenerationJobs(self, request, context):
        return jobs_rpc.list_jobs(self.d.jobs, request, pb.ListGenerationJobsResponse)

    async def CancelGenerationJob(self, request, context):
        return jobs_rpc.cancel(self.d.jobs, request, pb.CancelGenerationJobResponse)

    async def ListEnvironments(self, request, context):
        found = self.d.list_environments(request.capability, request.include_rejected)
        return pb.ListEnvironmentsResponse(environments=[_record(r) for r in found])

    async def GetEnvironment(self, request, context):
        return pb.GetEnvironmentResponse(environment=_record(self.d.get_environment(request.name, request.version)))

    async def ResetEpisode(self, request, context):
        env = parse(EnvironmentRefModel, request.environment, "environment")
        self.d.reset_episode(env.name, env.version, request.seed)

    async def StepEpisode(self, request, context):
        self.d.episode(request.episode_id)

    async def CloseEpisode(self, request, context):
        self.d.episode(request.episode_id)
