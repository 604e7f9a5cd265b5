"""TrainerService gRPC servicer: proto <-> domain translation only."""

from __future__ import annotations

import asyncio

from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Struct

from trace_common.grpc import jobs_rpc
from trace_common.grpc.protoconv import parse
from trace_common.proto.trace.v1 import trainer_service_pb2 as pb
from trace_common.proto.trace.v1 import trainer_service_pb2_grpc as pb_grpc
from trace_common.proto.trace.v1 import types_pb2

from .service import IterationRecord, Training
from .specs import TrainingSpecModel


def _iteration(rec: IterationRecord) -> pb.IterationMetrics:
    return pb.IterationMetrics(iteration=rec.iteration, values=rec.values)


class TrainerServicer(pb_grpc.TrainerServiceServicer):
    def __init__(self, domain: Training):
        self.d = domain

    async def CreateTrainingJob(self, request, context):
        spec = parse(TrainingSpecModel, request.spec, "spec")
        # off the loop: validation may call the environment service (which may share this loop)
        config = await asyncio.to_thread(self.d.validate, spec)
        rec = self.d.create_job(spec, request.run_id, dict(request.labels), request.request_id, config=config)
        return pb.CreateTrainingJobResponse(job=jobs_rpc.job_to_proto(rec))

    async def GetTrainingJob(self, request, context):
        rec = self.d.jobs.get(request.job_id)
        return pb.GetTrainingJobResponse(job=jobs_rpc.job_to_proto(rec),
                                         recent_iterations=[_iteration(r) for r in
                                                            self.d.recent_iterations(request.job_id)])

    async def WatchTrainingJob(self, request, context):
        async for rec, iteration in self.d.watch(request.job_id):
            msg = pb.WatchTrainingJobResponse(job=jobs_rpc.job_to_proto(rec))
            if iteration is not None:
                msg.iteration.CopyFrom(_iteration(iteration))
            yield msg

    async def ListTrainingJobs(self, request, context):
        return jobs_rpc.list_jobs(self.d.jobs, request, pb.ListTrainingJobsResponse)

    async def CancelTrainingJob(self, request, context):
        return jobs_rpc.cancel(self.d.jobs, request, pb.CancelTrainingJobResponse)

    async def ValidateTrainingConfig(self, request, context):
        values = MessageToDict(request.config.values) if request.config.HasField("values") else {}
        kind = pb.TrainingKind.Name(request.kind) if request.kind in pb.TrainingKind.values() else str(request.kind)
        executor = (pb.Executor.Name(request.executor) if request.executor in pb.Executor.values()
                    else str(request.executor))
        config = self.d.validate_config(kind, values, request.field_path,
                                        executor=None if executor == "EXECUTOR_UNSPECIFIED" else executor)
        normalized = Struct()
        normalized.update(config.model_dump(mode="json"))
        return pb.ValidateTrainingConfigResponse(config=types_pb2.Config(values=normalized))

    async def ListCheckpoints(self, request, context):
        return pb.ListCheckpointsResponse(checkpoints=[
            pb.Checkpoint(iteration=c.iteration, artifact=types_pb2.ArtifactRef(
                uri=c.uri, sha256=c.sha256, size_bytes=c.size, kind="checkpoint"))
            for c in self.d.list_checkpoints(request.job_id)])
