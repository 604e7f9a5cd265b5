"""TrainerService gRPC servicer: proto <-> domain translation only."""

from __future__ import annotations

from trace_common.grpc import jobs_rpc
from trace_common.grpc.protoconv import parse
from trace_common.proto.trace.v1 import trainer_service_pb2 as pb
from trace_common.proto.trace.v1 import trainer_service_pb2_grpc as pb_grpc

from .service import Training
from .specs import TrainingSpecModel


class TrainerServicer(pb_grpc.TrainerServiceServicer):
    def __init__(self, domain: Training):
        self.d = domain

    async def CreateTrainingJob(self, request, context):
        spec = parse(TrainingSpecModel, request.spec, "spec")
        rec = self.d.create_job(spec, request.run_id, dict(request.labels), request.request_id)
        return pb.CreateTrainingJobResponse(job=jobs_rpc.job_to_proto(rec))

    async def GetTrainingJob(self, request, context):
        return jobs_rpc.get(self.d.jobs, request, pb.GetTrainingJobResponse)

    async def WatchTrainingJob(self, request, context):
        async for msg in jobs_rpc.watch(self.d.jobs, request, pb.WatchTrainingJobResponse):
            yield msg

    async def ListTrainingJobs(self, request, context):
        return jobs_rpc.list_jobs(self.d.jobs, request, pb.ListTrainingJobsResponse)

    async def CancelTrainingJob(self, request, context):
        return jobs_rpc.cancel(self.d.jobs, request, pb.CancelTrainingJobResponse)

    async def ListCheckpoints(self, request, context):
        return pb.ListCheckpointsResponse(checkpoints=self.d.list_checkpoints(request.job_id))
