"""Client and server classes corresponding to protobuf-defined services."""
import grpc
import warnings
from ...trace.v1 import inference_service_pb2 as trace_dot_v1_dot_inference__service__pb2
GRPC_GENERATED_VERSION = '1.85.1'
GRPC_VERSION = grpc.__version__
_version_not_supported = False
try:
    from grpc._utilities import first_version_is_lower
    _version_not_supported = first_version_is_lower(GRPC_VERSION, GRPC_GENERATED_VERSION)
except ImportError:
    _version_not_supported = True
if _version_not_supported:
    raise RuntimeError(f'The grpc package installed is at version {GRPC_VERSION},' + ' but the generated code in trace/v1/inference_service_pb2_grpc.py depends on' + f' grpcio>={GRPC_GENERATED_VERSION}.' + f' Please upgrade your grpc module to grpcio>={GRPC_GENERATED_VERSION}' + f' or downgrade your generated code using grpcio-tools<={GRPC_VERSION}.')

class InferenceServiceStub:
    """Serves a base model + capability adapters + per-layer gates with token-level top-1
    routing. An OpenAI-compatible /v1/chat/completions is served next to this API.
    """

    def __init__(self, channel):
        """Constructor.

        Args:
            channel: A grpc.Channel.
        """
        self.LoadComposition = channel.unary_unary('/trace.v1.InferenceService/LoadComposition', request_serializer=trace_dot_v1_dot_inference__service__pb2.LoadCompositionRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_inference__service__pb2.LoadCompositionResponse.FromString, _registered_method=True)
        self.ListCompositions = channel.unary_unary('/trace.v1.InferenceService/ListCompositions', request_serializer=trace_dot_v1_dot_inference__service__pb2.ListCompositionsRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_inference__service__pb2.ListCompositionsResponse.FromString, _registered_method=True)
        self.UnloadComposition = channel.unary_unary('/trace.v1.InferenceService/UnloadComposition', request_serializer=trace_dot_v1_dot_inference__service__pb2.UnloadCompositionRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_inference__service__pb2.UnloadCompositionResponse.FromString, _registered_method=True)
        self.Generate = channel.unary_unary('/trace.v1.InferenceService/Generate', request_serializer=trace_dot_v1_dot_inference__service__pb2.GenerateRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_inference__service__pb2.GenerateResponse.FromString, _registered_method=True)
        self.GenerateStream = channel.unary_stream('/trace.v1.InferenceService/GenerateStream', request_serializer=trace_dot_v1_dot_inference__service__pb2.GenerateStreamRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_inference__service__pb2.GenerateStreamResponse.FromString, _registered_method=True)

class InferenceServiceServicer:
    """Serves a base model + capability adapters + per-layer gates with token-level top-1
    routing. An OpenAI-compatible /v1/chat/completions is served next to this API.
    """

    def LoadComposition(self, request, context):
        """Load a composition; on failure the previously loaded one keeps serving.
        """
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def ListCompositions(self, request, context):
        """Missing associated documentation comment in .proto file."""
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def UnloadComposition(self, request, context):
        """Missing associated documentation comment in .proto file."""
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def Generate(self, request, context):
        """One chat completion.
        """
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def GenerateStream(self, request, context):
        """A chat completion streamed token by token.
        """
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

def add_InferenceServiceServicer_to_server(servicer, server):
    rpc_method_handlers = {'LoadComposition': grpc.unary_unary_rpc_method_handler(servicer.LoadComposition, request_deserializer=trace_dot_v1_dot_inference__service__pb2.LoadCompositionRequest.FromString, response_serializer=trace_dot_v1_dot_inference__service__pb2.LoadCompositionResponse.SerializeToString), 'ListCompositions': grpc.unary_unary_rpc_method_handler(servicer.ListCompositions, request_deserializer=trace_dot_v1_dot_inference__service__pb2.ListCompositionsRequest.FromString, response_serializer=trace_dot_v1_dot_inference__service__pb2.ListCompositionsResponse.SerializeToString), 'UnloadComposition': grpc.unary_unary_rpc_method_handler(servicer.UnloadComposition, request_deserializer=trace_dot_v1_dot_inference__service__pb2.UnloadCompositionRequest.FromString, response_serializer=trace_dot_v1_dot_inference__service__pb2.UnloadCompositionResponse.SerializeToString), 'Generate': grpc.unary_unary_rpc_method_handler(servicer.Generate, request_deserializer=trace_dot_v1_dot_inference__service__pb2.GenerateRequest.FromString, response_serializer=trace_dot_v1_dot_inference__service__pb2.GenerateResponse.SerializeToString), 'GenerateStream': grpc.unary_stream_rpc_method_handler(servicer.GenerateStream, request_deserializer=trace_dot_v1_dot_inference__service__pb2.GenerateStreamRequest.FromString, response_serializer=trace_dot_v1_dot_inference__service__pb2.GenerateStreamResponse.SerializeToString)}
    generic_handler = grpc.method_handlers_generic_handler('trace.v1.InferenceService', rpc_method_handlers)
    server.add_generic_rpc_handlers((generic_handler,))
    server.add_registered_method_handlers('trace.v1.InferenceService', rpc_method_handlers)

class InferenceService:
    """Serves a base model + capability adapters + per-layer gates with token-level top-1
    routing. An OpenAI-compatible /v1/chat/completions is served next to this API.
    """

    @staticmethod
    def LoadComposition(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.InferenceService/LoadComposition', trace_dot_v1_dot_inference__service__pb2.LoadCompositionRequest.SerializeToString, trace_dot_v1_dot_inference__service__pb2.LoadCompositionResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def ListCompositions(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.InferenceService/ListCompositions', trace_dot_v1_dot_inference__service__pb2.ListCompositionsRequest.SerializeToString, trace_dot_v1_dot_inference__service__pb2.ListCompositionsResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def UnloadComposition(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.InferenceService/UnloadComposition', trace_dot_v1_dot_inference__service__pb2.UnloadCompositionRequest.SerializeToString, trace_dot_v1_dot_inference__service__pb2.UnloadCompositionResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def Generate(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.InferenceService/Generate', trace_dot_v1_dot_inference__service__pb2.GenerateRequest.SerializeToString, trace_dot_v1_dot_inference__service__pb2.GenerateResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def GenerateStream(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_stream(request, target, '/trace.v1.InferenceService/GenerateStream', trace_dot_v1_dot_inference__service__pb2.GenerateStreamRequest.SerializeToString, trace_dot_v1_dot_inference__service__pb2.GenerateStreamResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)