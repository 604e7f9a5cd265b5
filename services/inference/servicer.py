"""InferenceService gRPC servicer: proto <-> domain translation only."""

from __future__ import annotations

from trace_common.grpc.protoconv import parse
from trace_common.proto.trace.v1 import inference_service_pb2 as pb
from trace_common.proto.trace.v1 import inference_service_pb2_grpc as pb_grpc

from .service import Inference
from .specs import CompositionSpecModel, GenerateModel


class InferenceServicer(pb_grpc.InferenceServiceServicer):
    def __init__(self, domain: Inference):
        self.d = domain

    async def LoadComposition(self, request, context):
        self.d.load(parse(CompositionSpecModel, request.spec, "spec"))

    async def ListCompositions(self, request, context):
        return pb.ListCompositionsResponse(compositions=[pb.CompositionInfo(spec=pb.CompositionSpec(
            name=s.name, base_model=s.base_model)) for s in self.d.compositions.values()])

    async def UnloadComposition(self, request, context):
        self.d.unload(request.name)
        return pb.UnloadCompositionResponse()

    async def Generate(self, request, context):
        self.d.generate(parse(GenerateModel, request, "request"))

    async def GenerateStream(self, request, context):
        self.d.generate(parse(GenerateModel, request, "request"))
        yield pb.GenerateStreamResponse()  # pragma: no cover -- generate raises until issue 8
