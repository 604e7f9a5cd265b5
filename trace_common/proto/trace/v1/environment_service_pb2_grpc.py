"""Client and server classes corresponding to protobuf-defined services."""
import grpc
import warnings
from ...trace.v1 import environment_service_pb2 as trace_dot_v1_dot_environment__service__pb2
GRPC_GENERATED_VERSION = '1.85.1'
GRPC_VERSION = grpc.__version__
_version_not_supported = False
try:
    from grpc._utilities import first_version_is_lower
    _version_not_supported = first_version_is_lower(GRPC_VERSION, GRPC_GENERATED_VERSION)
except ImportError:
    _version_not_supported = True
if _version_not_supported:
    raise RuntimeError(f'The grpc package installed is at version {GRPC_VERSION},' + ' but the generated code in trace/v1/environment_service_pb2_grpc.py depends on' + f' grpcio>={GRPC_GENERATED_VERSION}.' + f' Please upgrade your grpc module to grpcio>={GRPC_GENERATED_VERSION}' + f' or downgrade your generated code using grpcio-tools<={GRPC_VERSION}.')

class EnvironmentServiceStub:
    """Step 3 of TRACE: one verifiable training environment per capability, generated (or
    selected from the library), validated in a sandbox, registered, and served by seed.
    """

    def __init__(self, channel):
        """Constructor.

        Args:
            channel: A grpc.Channel.
        """
        self.CreateGenerationJob = channel.unary_unary('/trace.v1.EnvironmentService/CreateGenerationJob', request_serializer=trace_dot_v1_dot_environment__service__pb2.CreateGenerationJobRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_environment__service__pb2.CreateGenerationJobResponse.FromString, _registered_method=True)
        self.GetGenerationJob = channel.unary_unary('/trace.v1.EnvironmentService/GetGenerationJob', request_serializer=trace_dot_v1_dot_environment__service__pb2.GetGenerationJobRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_environment__service__pb2.GetGenerationJobResponse.FromString, _registered_method=True)
        self.WatchGenerationJob = channel.unary_stream('/trace.v1.EnvironmentService/WatchGenerationJob', request_serializer=trace_dot_v1_dot_environment__service__pb2.WatchGenerationJobRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_environment__service__pb2.WatchGenerationJobResponse.FromString, _registered_method=True)
        self.ListGenerationJobs = channel.unary_unary('/trace.v1.EnvironmentService/ListGenerationJobs', request_serializer=trace_dot_v1_dot_environment__service__pb2.ListGenerationJobsRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_environment__service__pb2.ListGenerationJobsResponse.FromString, _registered_method=True)
        self.CancelGenerationJob = channel.unary_unary('/trace.v1.EnvironmentService/CancelGenerationJob', request_serializer=trace_dot_v1_dot_environment__service__pb2.CancelGenerationJobRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_environment__service__pb2.CancelGenerationJobResponse.FromString, _registered_method=True)
        self.ListEnvironments = channel.unary_unary('/trace.v1.EnvironmentService/ListEnvironments', request_serializer=trace_dot_v1_dot_environment__service__pb2.ListEnvironmentsRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_environment__service__pb2.ListEnvironmentsResponse.FromString, _registered_method=True)
        self.GetEnvironment = channel.unary_unary('/trace.v1.EnvironmentService/GetEnvironment', request_serializer=trace_dot_v1_dot_environment__service__pb2.GetEnvironmentRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_environment__service__pb2.GetEnvironmentResponse.FromString, _registered_method=True)
        self.ResetEpisode = channel.unary_unary('/trace.v1.EnvironmentService/ResetEpisode', request_serializer=trace_dot_v1_dot_environment__service__pb2.ResetEpisodeRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_environment__service__pb2.ResetEpisodeResponse.FromString, _registered_method=True)
        self.StepEpisode = channel.unary_unary('/trace.v1.EnvironmentService/StepEpisode', request_serializer=trace_dot_v1_dot_environment__service__pb2.StepEpisodeRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_environment__service__pb2.StepEpisodeResponse.FromString, _registered_method=True)
        self.CloseEpisode = channel.unary_unary('/trace.v1.EnvironmentService/CloseEpisode', request_serializer=trace_dot_v1_dot_environment__service__pb2.CloseEpisodeRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_environment__service__pb2.CloseEpisodeResponse.FromString, _registered_method=True)

class EnvironmentServiceServicer:
    """Step 3 of TRACE: one verifiable training environment per capability, generated (or
    selected from the library), validated in a sandbox, registered, and served by seed.
    """

    def CreateGenerationJob(self, request, context):
        """Start generation for one or more capabilities (one environment each, in parallel).
        """
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def GetGenerationJob(self, request, context):
        """Missing associated documentation comment in .proto file."""
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def WatchGenerationJob(self, request, context):
        """Missing associated documentation comment in .proto file."""
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def ListGenerationJobs(self, request, context):
        """Missing associated documentation comment in .proto file."""
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def CancelGenerationJob(self, request, context):
        """Missing associated documentation comment in .proto file."""
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def ListEnvironments(self, request, context):
        """Registered environments with their validation summary.
        """
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def GetEnvironment(self, request, context):
        """Missing associated documentation comment in .proto file."""
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def ResetEpisode(self, request, context):
        """Start an episode of a registered environment (runs in the sandbox worker).
        """
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def StepEpisode(self, request, context):
        """Apply one agent action to an open episode.
        """
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def CloseEpisode(self, request, context):
        """Close an episode and free its sandbox.
        """
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

def add_EnvironmentServiceServicer_to_server(servicer, server):
    rpc_method_handlers = {'CreateGenerationJob': grpc.unary_unary_rpc_method_handler(servicer.CreateGenerationJob, request_deserializer=trace_dot_v1_dot_environment__service__pb2.CreateGenerationJobRequest.FromString, response_serializer=trace_dot_v1_dot_environment__service__pb2.CreateGenerationJobResponse.SerializeToString), 'GetGenerationJob': grpc.unary_unary_rpc_method_handler(servicer.GetGenerationJob, request_deserializer=trace_dot_v1_dot_environment__service__pb2.GetGenerationJobRequest.FromString, response_serializer=trace_dot_v1_dot_environment__service__pb2.GetGenerationJobResponse.SerializeToString), 'WatchGenerationJob': grpc.unary_stream_rpc_method_handler(servicer.WatchGenerationJob, request_deserializer=trace_dot_v1_dot_environment__service__pb2.WatchGenerationJobRequest.FromString, response_serializer=trace_dot_v1_dot_environment__service__pb2.WatchGenerationJobResponse.SerializeToString), 'ListGenerationJobs': grpc.unary_unary_rpc_method_handler(servicer.ListGenerationJobs, request_deserializer=trace_dot_v1_dot_environment__service__pb2.ListGenerationJobsRequest.FromString, response_serializer=trace_dot_v1_dot_environment__service__pb2.ListGenerationJobsResponse.SerializeToString), 'CancelGenerationJob': grpc.unary_unary_rpc_method_handler(servicer.CancelGenerationJob, request_deserializer=trace_dot_v1_dot_environment__service__pb2.CancelGenerationJobRequest.FromString, response_serializer=trace_dot_v1_dot_environment__service__pb2.CancelGenerationJobResponse.SerializeToString), 'ListEnvironments': grpc.unary_unary_rpc_method_handler(servicer.ListEnvironments, request_deserializer=trace_dot_v1_dot_environment__service__pb2.ListEnvironmentsRequest.FromString, response_serializer=trace_dot_v1_dot_environment__service__pb2.ListEnvironmentsResponse.SerializeToString), 'GetEnvironment': grpc.unary_unary_rpc_method_handler(servicer.GetEnvironment, request_deserializer=trace_dot_v1_dot_environment__service__pb2.GetEnvironmentRequest.FromString, response_serializer=trace_dot_v1_dot_environment__service__pb2.GetEnvironmentResponse.SerializeToString), 'ResetEpisode': grpc.unary_unary_rpc_method_handler(servicer.ResetEpisode, request_deserializer=trace_dot_v1_dot_environment__service__pb2.ResetEpisodeRequest.FromString, response_serializer=trace_dot_v1_dot_environment__service__pb2.ResetEpisodeResponse.SerializeToString), 'StepEpisode': grpc.unary_unary_rpc_method_handler(servicer.StepEpisode, request_deserializer=trace_dot_v1_dot_environment__service__pb2.StepEpisodeRequest.FromString, response_serializer=trace_dot_v1_dot_environment__service__pb2.StepEpisodeResponse.SerializeToString), 'CloseEpisode': grpc.unary_unary_rpc_method_handler(servicer.CloseEpisode, request_deserializer=trace_dot_v1_dot_environment__service__pb2.CloseEpisodeRequest.FromString, response_serializer=trace_dot_v1_dot_environment__service__pb2.CloseEpisodeResponse.SerializeToString)}
    generic_handler = grpc.method_handlers_generic_handler('trace.v1.EnvironmentService', rpc_method_handlers)
    server.add_generic_rpc_handlers((generic_handler,))
    server.add_registered_method_handlers('trace.v1.EnvironmentService', rpc_method_handlers)

class EnvironmentService:
    """Step 3 of TRACE: one verifiable training environment per capability, generated (or
    selected from the library), validated in a sandbox, registered, and served by seed.
    """

    @staticmethod
    def CreateGenerationJob(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.EnvironmentService/CreateGenerationJob', trace_dot_v1_dot_environment__service__pb2.CreateGenerationJobRequest.SerializeToString, trace_dot_v1_dot_environment__service__pb2.CreateGenerationJobResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def GetGenerationJob(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.EnvironmentService/GetGenerationJob', trace_dot_v1_dot_environment__service__pb2.GetGenerationJobRequest.SerializeToString, trace_dot_v1_dot_environment__service__pb2.GetGenerationJobResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def WatchGenerationJob(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_stream(request, target, '/trace.v1.EnvironmentService/WatchGenerationJob', trace_dot_v1_dot_environment__service__pb2.WatchGenerationJobRequest.SerializeToString, trace_dot_v1_dot_environment__service__pb2.WatchGenerationJobResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def ListGenerationJobs(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.EnvironmentService/ListGenerationJobs', trace_dot_v1_dot_environment__service__pb2.ListGenerationJobsRequest.SerializeToString, trace_dot_v1_dot_environment__service__pb2.ListGenerationJobsResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def CancelGenerationJob(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.EnvironmentService/CancelGenerationJob', trace_dot_v1_dot_environment__service__pb2.CancelGenerationJobRequest.SerializeToString, trace_dot_v1_dot_environment__service__pb2.CancelGenerationJobResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def ListEnvironments(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.EnvironmentService/ListEnvironments', trace_dot_v1_dot_environment__service__pb2.ListEnvironmentsRequest.SerializeToString, trace_dot_v1_dot_environment__service__pb2.ListEnvironmentsResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def GetEnvironment(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.EnvironmentService/GetEnvironment', trace_dot_v1_dot_environment__service__pb2.GetEnvironmentRequest.SerializeToString, trace_dot_v1_dot_environment__service__pb2.GetEnvironmentResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def ResetEpisode(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.EnvironmentService/ResetEpisode', trace_dot_v1_dot_environment__service__pb2.ResetEpisodeRequest.SerializeToString, trace_dot_v1_dot_environment__service__pb2.ResetEpisodeResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def StepEpisode(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.EnvironmentService/StepEpisode', trace_dot_v1_dot_environment__service__pb2.StepEpisodeRequest.SerializeToString, trace_dot_v1_dot_environment__service__pb2.StepEpisodeResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def CloseEpisode(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.EnvironmentService/CloseEpisode', trace_dot_v1_dot_environment__service__pb2.CloseEpisodeRequest.SerializeToString, trace_dot_v1_dot_environment__service__pb2.CloseEpisodeResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)