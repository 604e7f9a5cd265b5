"""Client and server classes corresponding to protobuf-defined services."""
import grpc
import warnings
from ...trace.v1 import rollout_service_pb2 as trace_dot_v1_dot_rollout__service__pb2
GRPC_GENERATED_VERSION = '1.85.1'
GRPC_VERSION = grpc.__version__
_version_not_supported = False
try:
    from grpc._utilities import first_version_is_lower
    _version_not_supported = first_version_is_lower(GRPC_VERSION, GRPC_GENERATED_VERSION)
except ImportError:
    _version_not_supported = True
if _version_not_supported:
    raise RuntimeError(f'The grpc package installed is at version {GRPC_VERSION},' + ' but the generated code in trace/v1/rollout_service_pb2_grpc.py depends on' + f' grpcio>={GRPC_GENERATED_VERSION}.' + f' Please upgrade your grpc module to grpcio>={GRPC_GENERATED_VERSION}' + f' or downgrade your generated code using grpcio-tools<={GRPC_VERSION}.')

class RolloutServiceStub:
    """Step 1 of TRACE: run an agent policy over an environment's tasks and store trajectories
    (JSONL, sha256-verified) in the artifact store.
    """

    def __init__(self, channel):
        """Constructor.

        Args:
            channel: A grpc.Channel.
        """
        self.CreateRolloutJob = channel.unary_unary('/trace.v1.RolloutService/CreateRolloutJob', request_serializer=trace_dot_v1_dot_rollout__service__pb2.CreateRolloutJobRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_rollout__service__pb2.CreateRolloutJobResponse.FromString, _registered_method=True)
        self.GetRolloutJob = channel.unary_unary('/trace.v1.RolloutService/GetRolloutJob', request_serializer=trace_dot_v1_dot_rollout__service__pb2.GetRolloutJobRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_rollout__service__pb2.GetRolloutJobResponse.FromString, _registered_method=True)
        self.WatchRolloutJob = channel.unary_stream('/trace.v1.RolloutService/WatchRolloutJob', request_serializer=trace_dot_v1_dot_rollout__service__pb2.WatchRolloutJobRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_rollout__service__pb2.WatchRolloutJobResponse.FromString, _registered_method=True)
        self.ListRolloutJobs = channel.unary_unary('/trace.v1.RolloutService/ListRolloutJobs', request_serializer=trace_dot_v1_dot_rollout__service__pb2.ListRolloutJobsRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_rollout__service__pb2.ListRolloutJobsResponse.FromString, _registered_method=True)
        self.CancelRolloutJob = channel.unary_unary('/trace.v1.RolloutService/CancelRolloutJob', request_serializer=trace_dot_v1_dot_rollout__service__pb2.CancelRolloutJobRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_rollout__service__pb2.CancelRolloutJobResponse.FromString, _registered_method=True)
        self.ListRolloutEnvironments = channel.unary_unary('/trace.v1.RolloutService/ListRolloutEnvironments', request_serializer=trace_dot_v1_dot_rollout__service__pb2.ListRolloutEnvironmentsRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_rollout__service__pb2.ListRolloutEnvironmentsResponse.FromString, _registered_method=True)

class RolloutServiceServicer:
    """Step 1 of TRACE: run an agent policy over an environment's tasks and store trajectories
    (JSONL, sha256-verified) in the artifact store.
    """

    def CreateRolloutJob(self, request, context):
        """Start a rollout job: tasks x samples of one environment with one policy.
        """
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def GetRolloutJob(self, request, context):
        """Poll a job.
        """
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def WatchRolloutJob(self, request, context):
        """Stream a job's updates until it ends (the last message has a terminal state).
        """
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def ListRolloutJobs(self, request, context):
        """List jobs, newest first.
        """
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def CancelRolloutJob(self, request, context):
        """Cancel a job; completed episodes are kept, the trajectories file is not published.
        """
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def ListRolloutEnvironments(self, request, context):
        """Environments this service can play, with their task splits.
        """
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

def add_RolloutServiceServicer_to_server(servicer, server):
    rpc_method_handlers = {'CreateRolloutJob': grpc.unary_unary_rpc_method_handler(servicer.CreateRolloutJob, request_deserializer=trace_dot_v1_dot_rollout__service__pb2.CreateRolloutJobRequest.FromString, response_serializer=trace_dot_v1_dot_rollout__service__pb2.CreateRolloutJobResponse.SerializeToString), 'GetRolloutJob': grpc.unary_unary_rpc_method_handler(servicer.GetRolloutJob, request_deserializer=trace_dot_v1_dot_rollout__service__pb2.GetRolloutJobRequest.FromString, response_serializer=trace_dot_v1_dot_rollout__service__pb2.GetRolloutJobResponse.SerializeToString), 'WatchRolloutJob': grpc.unary_stream_rpc_method_handler(servicer.WatchRolloutJob, request_deserializer=trace_dot_v1_dot_rollout__service__pb2.WatchRolloutJobRequest.FromString, response_serializer=trace_dot_v1_dot_rollout__service__pb2.WatchRolloutJobResponse.SerializeToString), 'ListRolloutJobs': grpc.unary_unary_rpc_method_handler(servicer.ListRolloutJobs, request_deserializer=trace_dot_v1_dot_rollout__service__pb2.ListRolloutJobsRequest.FromString, response_serializer=trace_dot_v1_dot_rollout__service__pb2.ListRolloutJobsResponse.SerializeToString), 'CancelRolloutJob': grpc.unary_unary_rpc_method_handler(servicer.CancelRolloutJob, request_deserializer=trace_dot_v1_dot_rollout__service__pb2.CancelRolloutJobRequest.FromString, response_serializer=trace_dot_v1_dot_rollout__service__pb2.CancelRolloutJobResponse.SerializeToString), 'ListRolloutEnvironments': grpc.unary_unary_rpc_method_handler(servicer.ListRolloutEnvironments, request_deserializer=trace_dot_v1_dot_rollout__service__pb2.ListRolloutEnvironmentsRequest.FromString, response_serializer=trace_dot_v1_dot_rollout__service__pb2.ListRolloutEnvironmentsResponse.SerializeToString)}
    generic_handler = grpc.method_handlers_generic_handler('trace.v1.RolloutService', rpc_method_handlers)
    server.add_generic_rpc_handlers((generic_handler,))
    server.add_registered_method_handlers('trace.v1.RolloutService', rpc_method_handlers)

class RolloutService:
    """Step 1 of TRACE: run an agent policy over an environment's tasks and store trajectories
    (JSONL, sha256-verified) in the artifact store.
    """

    @staticmethod
    def CreateRolloutJob(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.RolloutService/CreateRolloutJob', trace_dot_v1_dot_rollout__service__pb2.CreateRolloutJobRequest.SerializeToString, trace_dot_v1_dot_rollout__service__pb2.CreateRolloutJobResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def GetRolloutJob(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.RolloutService/GetRolloutJob', trace_dot_v1_dot_rollout__service__pb2.GetRolloutJobRequest.SerializeToString, trace_dot_v1_dot_rollout__service__pb2.GetRolloutJobResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def WatchRolloutJob(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_stream(request, target, '/trace.v1.RolloutService/WatchRolloutJob', trace_dot_v1_dot_rollout__service__pb2.WatchRolloutJobRequest.SerializeToString, trace_dot_v1_dot_rollout__service__pb2.WatchRolloutJobResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def ListRolloutJobs(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.RolloutService/ListRolloutJobs', trace_dot_v1_dot_rollout__service__pb2.ListRolloutJobsRequest.SerializeToString, trace_dot_v1_dot_rollout__service__pb2.ListRolloutJobsResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def CancelRolloutJob(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.RolloutService/CancelRolloutJob', trace_dot_v1_dot_rollout__service__pb2.CancelRolloutJobRequest.SerializeToString, trace_dot_v1_dot_rollout__service__pb2.CancelRolloutJobResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def ListRolloutEnvironments(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.RolloutService/ListRolloutEnvironments', trace_dot_v1_dot_rollout__service__pb2.ListRolloutEnvironmentsRequest.SerializeToString, trace_dot_v1_dot_rollout__service__pb2.ListRolloutEnvironmentsResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)