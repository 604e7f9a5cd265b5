"""InferenceService gRPC servicer: proto <-> domain translation only."""

from __future__ import annotations

from trace_common.grpc.protoconv import parse
from trace_common.proto.trace.v1 import inference_service_pb2 as pb
from trace_common.proto.trace.v1 import inference_service_pb2_grpc as pb_grpc
from trace_common.proto.trace.v1 import types_pb2 as t
from trace_common.specs import COMPOSITION_ROUTING

from .service import (
    ChatRequest,
    Completion,
    Inference,
    StreamDelta,
    TokenRouteInfo,
    chat_request_from_generate,
)
from .specs import CompositionSpecModel, GenerateModel


def _info(info: dict) -> pb.CompositionInfo:
    """The served composition; its spec names the routing actually served (never UNSPECIFIED)."""
    return pb.CompositionInfo(
        spec=pb.CompositionSpec(name=info["name"], base_model=info["base_model"], gates_uri=info["gates_uri"],
                                adapters=[pb.AdapterRef(name=a["name"], uri=a["uri"]) for a in info["adapters"]],
                                routing=COMPOSITION_ROUTING[info["routing"]]),
        num_layers=info["num_layers"], hidden_size=info["hidden_size"], gate_parameters=info["gate_parameters"])


def _message(c: Completion) -> t.ChatMessage:
    msg = c.message
    return t.ChatMessage(role="assistant", content=msg.content or "",
                         tool_calls=[t.ToolCall(id=tc.id, name=tc.function.name, arguments_json=tc.function.arguments)
                                     for tc in msg.tool_calls or []])


def _route(r: TokenRouteInfo) -> pb.TokenRoute:
    return pb.TokenRoute(token_id=r.token_id, token_text=r.token_text, experts=r.experts)


def _request(request) -> ChatRequest:
    return chat_request_from_generate(parse(GenerateModel, request, "request"))


class InferenceServicer(pb_grpc.InferenceServiceServicer):
    def __init__(self, domain: Inference):
        self.d = domain

    async def LoadComposition(self, request, context):
        info = await self.d.load(parse(CompositionSpecModel, request.spec, "spec"))
        return pb.LoadCompositionResponse(composition=_info(info))

    async def ListCompositions(self, request, context):
        return pb.ListCompositionsResponse(compositions=[_info(i) for i in self.d.list()])

    async def UnloadComposition(self, request, context):
        await self.d.unload(request.name)
        return pb.UnloadCompositionResponse()

    async def Generate(self, request, context):
        c = await self.d.generate(_request(request))
        return pb.GenerateResponse(message=_message(c), finish_reason=c.finish_reason,
                                   usage=pb.Usage(prompt_tokens=c.prompt_tokens, completion_tokens=c.completion_tokens),
                                   routing_trace=[_route(r) for r in c.routing])

    async def GenerateStream(self, request, context):
        stream = self.d.generate_stream(_request(request))
        try:
            async for event in stream:
                if isinstance(event, StreamDelta):
                    yield pb.GenerateStreamResponse(delta=event.text,
                                                    routing=[_route(event.route)] if event.route else [])
                else:
                    yield pb.GenerateStreamResponse(
                        finish_reason=event.finish_reason, message=_message(event),
                        usage=pb.Usage(prompt_tokens=event.prompt_tokens, completion_tokens=event.completion_tokens))
        finally:
            await stream.aclose()
