"""EnvironmentService gRPC servicer: proto <-> domain translation only."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from trace_common.errors import InvalidArgument
from trace_common.grpc import jobs_rpc
from trace_common.grpc.protoconv import parse
from trace_common.proto.trace.v1 import environment_service_pb2 as pb
from trace_common.proto.trace.v1 import environment_service_pb2_grpc as pb_grpc
from trace_common.proto.trace.v1 import types_pb2 as t
from trace_common.specs import EnvironmentRefModel

from .registry import EnvironmentRecord
from .service import Environments
from .specs import GenerationSpecModel

_MODES = {"GENERATION_MODE_LIBRARY": pb.GENERATION_MODE_LIBRARY, "GENERATION_MODE_LLM": pb.GENERATION_MODE_LLM}
_STATUS = {"ACCEPTED": pb.VALIDATION_STATUS_ACCEPTED, "REJECTED": pb.VALIDATION_STATUS_REJECTED}


def _artifact(art: dict[str, Any], kind: str) -> t.ArtifactRef:
    return t.ArtifactRef(uri=art["uri"], sha256=art["sha256"], size_bytes=int(art["size"]), kind=kind)


def _record(r: EnvironmentRecord) -> pb.EnvironmentRecord:
    return pb.EnvironmentRecord(
        name=r.name, version=r.version, capability=r.capability, mode=_MODES.get(r.mode, 0),
        status=_STATUS.get(r.status, 0), code=_artifact(r.code, "environment-code"),
        validation_report=_artifact(r.validation, "validation-report"), rejection_reasons=r.reasons,
        calibration_reward_mean=r.calibration_mean, calibration_informative_fraction=r.informative_fraction)


def _message(d: dict[str, Any]) -> t.ChatMessage:
    calls = [t.ToolCall(id=c.get("id", ""), name=c["function"]["name"],
                        arguments_json=c["function"].get("arguments", "{}")) for c in d.get("tool_calls") or []]
    return t.ChatMessage(role=d["role"], content=d.get("content") or "", tool_calls=calls,
                         tool_call_id=d.get("tool_call_id") or "", name=d.get("name") or "")


def _tools(schemas: list[dict[str, Any]]) -> list[t.ToolSchema]:
    return [t.ToolSchema(json=json.dumps(s)) for s in schemas]


class EnvironmentServicer(pb_grpc.EnvironmentServiceServicer):
    def __init__(self, domain: Environments):
        self.d = domain

    async def CreateGenerationJob(self, request, context):
        spec = parse(GenerationSpecModel, request.spec, "spec")
        # off the loop: checking an in-process model ref imports torch the first time
        maker = await asyncio.to_thread(self.d.calibration_maker, spec.calibration_policy, spec.calibration_sampling)
        rec = self.d.create_job(spec, request.run_id, dict(request.labels), request.request_id, maker=maker)
        return pb.CreateGenerationJobResponse(job=jobs_rpc.job_to_proto(rec))

    async def GetGenerationJob(self, request, context):
        rec = self.d.jobs.get(request.job_id)
        return pb.GetGenerationJobResponse(job=jobs_rpc.job_to_proto(rec),
                                           environments=[_record(r) for r in self.d.environments_of(rec.job_id)])

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
        r = self.d.get_environment(request.name, request.version)
        return pb.GetEnvironmentResponse(environment=_record(r), tools=_tools(r.tool_schemas))

    async def ResetEpisode(self, request, context):
        env = parse(EnvironmentRefModel, request.environment, "environment")
        episode_id, obs, tools = await self.d.reset_episode(env.name, env.version, request.seed)
        return pb.ResetEpisodeResponse(episode_id=episode_id, messages=[_message(m) for m in obs["messages"]],
                                       tools=_tools(tools), guidance=obs.get("guidance") or "")

    async def StepEpisode(self, request, context):
        which = request.WhichOneof("action")
        if which == "tool_call":
            call = request.tool_call
            action: dict[str, Any] = {"name": call.name, "arguments": call.arguments_json or "{}",
                                      "call_id": call.id or "call_0"}
        elif which == "message":
            action = {"message": request.message}
        else:
            self.d.check_episode(request.episode_id)
            raise InvalidArgument(field="action", expected="a tool_call or a message",
                                  fix="Set StepEpisodeRequest.tool_call or .message.")
        out = await self.d.step_episode(request.episode_id, action)
        observation = _message(out.observation[0]) if out.observation else t.ChatMessage()
        return pb.StepEpisodeResponse(observation=observation, done=out.done, reward=out.reward,
                                      diagnostics_json=[json.dumps(d) for d in out.diagnostics])

    async def CloseEpisode(self, request, context):
        await self.d.close_episode(request.episode_id)
        return pb.CloseEpisodeResponse()
