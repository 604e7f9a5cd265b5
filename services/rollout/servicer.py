"""RolloutService gRPC servicer: proto <-> domain translation only."""

from __future__ import annotations

import json

from trace_common.grpc import jobs_rpc
from trace_common.grpc.protoconv import parse
from trace_common.proto.trace.v1 import rollout_service_pb2 as pb
from trace_common.proto.trace.v1 import rollout_service_pb2_grpc as pb_grpc
from trace_common.proto.trace.v1 import types_pb2 as t

from .service import Rollouts
from .specs import RolloutSpecModel


class RolloutServicer(pb_grpc.RolloutServiceServicer):
    def __init__(self, domain: Rollouts):
        self.d = domain

    async def CreateRolloutJob(self, request, context):
        spec = parse(RolloutSpecModel, request.spec, "spec")
        rec = await self.d.create_job(spec, request.run_id, dict(request.labels), request.request_id)
        return pb.CreateRolloutJobResponse(job=jobs_rpc.job_to_proto(rec))

    async def GetRolloutJob(self, request, context):
        rec = self.d.jobs.get(request.job_id)
        resp = pb.GetRolloutJobResponse(job=jobs_rpc.job_to_proto(rec))
        if rec.result is not None:
            s = rec.result
            resp.summary.CopyFrom(pb.RolloutSummary(
                episodes=s.episodes, successes=s.successes, pass_rate=s.pass_rate,
                pass_rate_ci_low=s.pass_rate_ci_low, pass_rate_ci_high=s.pass_rate_ci_high,
                reward_mean=s.reward_mean, errored_episodes=s.errored_episodes, terminations=s.terminations))
        return resp

    async def WatchRolloutJob(self, request, context):
        async for msg in jobs_rpc.watch(self.d.jobs, request, pb.WatchRolloutJobResponse):
            yield msg

    async def ListRolloutJobs(self, request, context):
        return jobs_rpc.list_jobs(self.d.jobs, request, pb.ListRolloutJobsResponse)

    async def CancelRolloutJob(self, request, context):
        return jobs_rpc.cancel(self.d.jobs, request, pb.CancelRolloutJobResponse)

    async def ListRolloutEnvironments(self, request, context):
        envs = []
        for e in self.d.environments():
            tools = [t.ToolSchema(json=json.dumps(x)) for x in e.pop("tools", [])]
            envs.append(pb.EnvironmentInfo(**e, tools=tools))
        return pb.ListRolloutEnvironmentsResponse(environments=envs)
