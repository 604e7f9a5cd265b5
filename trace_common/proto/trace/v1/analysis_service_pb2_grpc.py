"""Client and server classes corresponding to protobuf-defined services."""
import grpc
import warnings
from ...trace.v1 import analysis_service_pb2 as trace_dot_v1_dot_analysis__service__pb2
GRPC_GENERATED_VERSION = '1.85.1'
GRPC_VERSION = grpc.__version__
_version_not_supported = False
try:
    from grpc._utilities import first_version_is_lower
    _version_not_supported = first_version_is_lower(GRPC_VERSION, GRPC_GENERATED_VERSION)
except ImportError:
    _version_not_supported = True
if _version_not_supported:
    raise RuntimeError(f'The grpc package installed is at version {GRPC_VERSION},' + ' but the generated code in trace/v1/analysis_service_pb2_grpc.py depends on' + f' grpcio>={GRPC_GENERATED_VERSION}.' + f' Please upgrade your grpc module to grpcio>={GRPC_GENERATED_VERSION}' + f' or downgrade your generated code using grpcio-tools<={GRPC_VERSION}.')

class AnalysisServiceStub:
    """Step 2 of TRACE: contrastive capability analysis of stored trajectories.
    """

    def __init__(self, channel):
        """Constructor.

        Args:
            channel: A grpc.Channel.
        """
        self.CreateAnalysisJob = channel.unary_unary('/trace.v1.AnalysisService/CreateAnalysisJob', request_serializer=trace_dot_v1_dot_analysis__service__pb2.CreateAnalysisJobRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_analysis__service__pb2.CreateAnalysisJobResponse.FromString, _registered_method=True)
        self.GetAnalysisJob = channel.unary_unary('/trace.v1.AnalysisService/GetAnalysisJob', request_serializer=trace_dot_v1_dot_analysis__service__pb2.GetAnalysisJobRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_analysis__service__pb2.GetAnalysisJobResponse.FromString, _registered_method=True)
        self.WatchAnalysisJob = channel.unary_stream('/trace.v1.AnalysisService/WatchAnalysisJob', request_serializer=trace_dot_v1_dot_analysis__service__pb2.WatchAnalysisJobRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_analysis__service__pb2.WatchAnalysisJobResponse.FromString, _registered_method=True)
        self.ListAnalysisJobs = channel.unary_unary('/trace.v1.AnalysisService/ListAnalysisJobs', request_serializer=trace_dot_v1_dot_analysis__service__pb2.ListAnalysisJobsRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_analysis__service__pb2.ListAnalysisJobsResponse.FromString, _registered_method=True)
        self.CancelAnalysisJob = channel.unary_unary('/trace.v1.AnalysisService/CancelAnalysisJob', request_serializer=trace_dot_v1_dot_analysis__service__pb2.CancelAnalysisJobRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_analysis__service__pb2.CancelAnalysisJobResponse.FromString, _registered_method=True)

class AnalysisServiceServicer:
    """Step 2 of TRACE: contrastive capability analysis of stored trajectories.
    """

    def CreateAnalysisJob(self, request, context):
        """Start an analysis: discovery once, then N independent labeling runs and statistics.
        """
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def GetAnalysisJob(self, request, context):
        """Missing associated documentation comment in .proto file."""
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def WatchAnalysisJob(self, request, context):
        """Missing associated documentation comment in .proto file."""
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def ListAnalysisJobs(self, request, context):
        """Missing associated documentation comment in .proto file."""
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def CancelAnalysisJob(self, request, context):
        """Missing associated documentation comment in .proto file."""
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

def add_AnalysisServiceServicer_to_server(servicer, server):
    rpc_method_handlers = {'CreateAnalysisJob': grpc.unary_unary_rpc_method_handler(servicer.CreateAnalysisJob, request_deserializer=trace_dot_v1_dot_analysis__service__pb2.CreateAnalysisJobRequest.FromString, response_serializer=trace_dot_v1_dot_analysis__service__pb2.CreateAnalysisJobResponse.SerializeToString), 'GetAnalysisJob': grpc.unary_unary_rpc_method_handler(servicer.GetAnalysisJob, request_deserializer=trace_dot_v1_dot_analysis__service__pb2.GetAnalysisJobRequest.FromString, response_serializer=trace_dot_v1_dot_analysis__service__pb2.GetAnalysisJobResponse.SerializeToString), 'WatchAnalysisJob': grpc.unary_stream_rpc_method_handler(servicer.WatchAnalysisJob, request_deserializer=trace_dot_v1_dot_analysis__service__pb2.WatchAnalysisJobRequest.FromString, response_serializer=trace_dot_v1_dot_analysis__service__pb2.WatchAnalysisJobResponse.SerializeToString), 'ListAnalysisJobs': grpc.unary_unary_rpc_method_handler(servicer.ListAnalysisJobs, request_deserializer=trace_dot_v1_dot_analysis__service__pb2.ListAnalysisJobsRequest.FromString, response_serializer=trace_dot_v1_dot_analysis__service__pb2.ListAnalysisJobsResponse.SerializeToString), 'CancelAnalysisJob': grpc.unary_unary_rpc_method_handler(servicer.CancelAnalysisJob, request_deserializer=trace_dot_v1_dot_analysis__service__pb2.CancelAnalysisJobRequest.FromString, response_serializer=trace_dot_v1_dot_analysis__service__pb2.CancelAnalysisJobResponse.SerializeToString)}
    generic_handler = grpc.method_handlers_generic_handler('trace.v1.AnalysisService', rpc_method_handlers)
    server.add_generic_rpc_handlers((generic_handler,))
    server.add_registered_method_handlers('trace.v1.AnalysisService', rpc_method_handlers)

class AnalysisService:
    """Step 2 of TRACE: contrastive capability analysis of stored trajectories.
    """

    @staticmethod
    def CreateAnalysisJob(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.AnalysisService/CreateAnalysisJob', trace_dot_v1_dot_analysis__service__pb2.CreateAnalysisJobRequest.SerializeToString, trace_dot_v1_dot_analysis__service__pb2.CreateAnalysisJobResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def GetAnalysisJob(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.AnalysisService/GetAnalysisJob', trace_dot_v1_dot_analysis__service__pb2.GetAnalysisJobRequest.SerializeToString, trace_dot_v1_dot_analysis__service__pb2.GetAnalysisJobResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def WatchAnalysisJob(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_stream(request, target, '/trace.v1.AnalysisService/WatchAnalysisJob', trace_dot_v1_dot_analysis__service__pb2.WatchAnalysisJobRequest.SerializeToString, trace_dot_v1_dot_analysis__service__pb2.WatchAnalysisJobResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def ListAnalysisJobs(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.AnalysisService/ListAnalysisJobs', trace_dot_v1_dot_analysis__service__pb2.ListAnalysisJobsRequest.SerializeToString, trace_dot_v1_dot_analysis__service__pb2.ListAnalysisJobsResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def CancelAnalysisJob(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.AnalysisService/CancelAnalysisJob', trace_dot_v1_dot_analysis__service__pb2.CancelAnalysisJobRequest.SerializeToString, trace_dot_v1_dot_analysis__service__pb2.CancelAnalysisJobResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)