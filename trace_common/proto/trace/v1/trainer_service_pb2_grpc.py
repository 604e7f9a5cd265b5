"""Client and server classes corresponding to protobuf-defined services."""
import grpc
import warnings
from ...trace.v1 import trainer_service_pb2 as trace_dot_v1_dot_trainer__service__pb2
GRPC_GENERATED_VERSION = '1.85.1'
GRPC_VERSION = grpc.__version__
_version_not_supported = False
try:
    from grpc._utilities import first_version_is_lower
    _version_not_supported = first_version_is_lower(GRPC_VERSION, GRPC_GENERATED_VERSION)
except ImportError:
    _version_not_supported = True
if _version_not_supported:
    raise RuntimeError(f'The grpc package installed is at version {GRPC_VERSION},' + ' but the generated code in trace/v1/trainer_service_pb2_grpc.py depends on' + f' grpcio>={GRPC_GENERATED_VERSION}.' + f' Please upgrade your grpc module to grpcio>={GRPC_GENERATED_VERSION}' + f' or downgrade your generated code using grpcio-tools<={GRPC_VERSION}.')

class TrainerServiceStub:
    """Step 4 of TRACE: GRPO LoRA adapters per capability, then gate training of the MoE.
    A job runs as a local process (embedded default) or as a Kubernetes Job on the GPU pool.
    """

    def __init__(self, channel):
        """Constructor.

        Args:
            channel: A grpc.Channel.
        """
        self.CreateTrainingJob = channel.unary_unary('/trace.v1.TrainerService/CreateTrainingJob', request_serializer=trace_dot_v1_dot_trainer__service__pb2.CreateTrainingJobRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_trainer__service__pb2.CreateTrainingJobResponse.FromString, _registered_method=True)
        self.GetTrainingJob = channel.unary_unary('/trace.v1.TrainerService/GetTrainingJob', request_serializer=trace_dot_v1_dot_trainer__service__pb2.GetTrainingJobRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_trainer__service__pb2.GetTrainingJobResponse.FromString, _registered_method=True)
        self.WatchTrainingJob = channel.unary_stream('/trace.v1.TrainerService/WatchTrainingJob', request_serializer=trace_dot_v1_dot_trainer__service__pb2.WatchTrainingJobRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_trainer__service__pb2.WatchTrainingJobResponse.FromString, _registered_method=True)
        self.ListTrainingJobs = channel.unary_unary('/trace.v1.TrainerService/ListTrainingJobs', request_serializer=trace_dot_v1_dot_trainer__service__pb2.ListTrainingJobsRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_trainer__service__pb2.ListTrainingJobsResponse.FromString, _registered_method=True)
        self.CancelTrainingJob = channel.unary_unary('/trace.v1.TrainerService/CancelTrainingJob', request_serializer=trace_dot_v1_dot_trainer__service__pb2.CancelTrainingJobRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_trainer__service__pb2.CancelTrainingJobResponse.FromString, _registered_method=True)
        self.ListCheckpoints = channel.unary_unary('/trace.v1.TrainerService/ListCheckpoints', request_serializer=trace_dot_v1_dot_trainer__service__pb2.ListCheckpointsRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_trainer__service__pb2.ListCheckpointsResponse.FromString, _registered_method=True)
        self.ValidateTrainingConfig = channel.unary_unary('/trace.v1.TrainerService/ValidateTrainingConfig', request_serializer=trace_dot_v1_dot_trainer__service__pb2.ValidateTrainingConfigRequest.SerializeToString, response_deserializer=trace_dot_v1_dot_trainer__service__pb2.ValidateTrainingConfigResponse.FromString, _registered_method=True)

class TrainerServiceServicer:
    """Step 4 of TRACE: GRPO LoRA adapters per capability, then gate training of the MoE.
    A job runs as a local process (embedded default) or as a Kubernetes Job on the GPU pool.
    """

    def CreateTrainingJob(self, request, context):
        """Missing associated documentation comment in .proto file."""
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def GetTrainingJob(self, request, context):
        """Missing associated documentation comment in .proto file."""
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def WatchTrainingJob(self, request, context):
        """Streams job updates including one message per training iteration.
        """
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def ListTrainingJobs(self, request, context):
        """Missing associated documentation comment in .proto file."""
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def CancelTrainingJob(self, request, context):
        """Missing associated documentation comment in .proto file."""
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def ListCheckpoints(self, request, context):
        """Checkpoints written by a job, oldest first.
        """
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

    def ValidateTrainingConfig(self, request, context):
        """Parses a training config with the trainer's own model (the GRPO config for ADAPTER, the gate
        GRPO config for GATES) without creating a job or loading anything: INVALID_ARGUMENT naming
        the field (with the closest valid name for a mistyped one), else the config with every
        default filled in. Clients call it before they start work that a bad config would waste.
        With `executor` named, an ADAPTER config's vLLM rollouts are also checked against this
        trainer's settings as CreateTrainingJob checks a job under that executor.
        """
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details('Method not implemented!')
        raise NotImplementedError('Method not implemented!')

def add_TrainerServiceServicer_to_server(servicer, server):
    rpc_method_handlers = {'CreateTrainingJob': grpc.unary_unary_rpc_method_handler(servicer.CreateTrainingJob, request_deserializer=trace_dot_v1_dot_trainer__service__pb2.CreateTrainingJobRequest.FromString, response_serializer=trace_dot_v1_dot_trainer__service__pb2.CreateTrainingJobResponse.SerializeToString), 'GetTrainingJob': grpc.unary_unary_rpc_method_handler(servicer.GetTrainingJob, request_deserializer=trace_dot_v1_dot_trainer__service__pb2.GetTrainingJobRequest.FromString, response_serializer=trace_dot_v1_dot_trainer__service__pb2.GetTrainingJobResponse.SerializeToString), 'WatchTrainingJob': grpc.unary_stream_rpc_method_handler(servicer.WatchTrainingJob, request_deserializer=trace_dot_v1_dot_trainer__service__pb2.WatchTrainingJobRequest.FromString, response_serializer=trace_dot_v1_dot_trainer__service__pb2.WatchTrainingJobResponse.SerializeToString), 'ListTrainingJobs': grpc.unary_unary_rpc_method_handler(servicer.ListTrainingJobs, request_deserializer=trace_dot_v1_dot_trainer__service__pb2.ListTrainingJobsRequest.FromString, response_serializer=trace_dot_v1_dot_trainer__service__pb2.ListTrainingJobsResponse.SerializeToString), 'CancelTrainingJob': grpc.unary_unary_rpc_method_handler(servicer.CancelTrainingJob, request_deserializer=trace_dot_v1_dot_trainer__service__pb2.CancelTrainingJobRequest.FromString, response_serializer=trace_dot_v1_dot_trainer__service__pb2.CancelTrainingJobResponse.SerializeToString), 'ListCheckpoints': grpc.unary_unary_rpc_method_handler(servicer.ListCheckpoints, request_deserializer=trace_dot_v1_dot_trainer__service__pb2.ListCheckpointsRequest.FromString, response_serializer=trace_dot_v1_dot_trainer__service__pb2.ListCheckpointsResponse.SerializeToString), 'ValidateTrainingConfig': grpc.unary_unary_rpc_method_handler(servicer.ValidateTrainingConfig, request_deserializer=trace_dot_v1_dot_trainer__service__pb2.ValidateTrainingConfigRequest.FromString, response_serializer=trace_dot_v1_dot_trainer__service__pb2.ValidateTrainingConfigResponse.SerializeToString)}
    generic_handler = grpc.method_handlers_generic_handler('trace.v1.TrainerService', rpc_method_handlers)
    server.add_generic_rpc_handlers((generic_handler,))
    server.add_registered_method_handlers('trace.v1.TrainerService', rpc_method_handlers)

class TrainerService:
    """Step 4 of TRACE: GRPO LoRA adapters per capability, then gate training of the MoE.
    A job runs as a local process (embedded default) or as a Kubernetes Job on the GPU pool.
    """

    @staticmethod
    def CreateTrainingJob(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.TrainerService/CreateTrainingJob', trace_dot_v1_dot_trainer__service__pb2.CreateTrainingJobRequest.SerializeToString, trace_dot_v1_dot_trainer__service__pb2.CreateTrainingJobResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def GetTrainingJob(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.TrainerService/GetTrainingJob', trace_dot_v1_dot_trainer__service__pb2.GetTrainingJobRequest.SerializeToString, trace_dot_v1_dot_trainer__service__pb2.GetTrainingJobResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def WatchTrainingJob(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_stream(request, target, '/trace.v1.TrainerService/WatchTrainingJob', trace_dot_v1_dot_trainer__service__pb2.WatchTrainingJobRequest.SerializeToString, trace_dot_v1_dot_trainer__service__pb2.WatchTrainingJobResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def ListTrainingJobs(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.TrainerService/ListTrainingJobs', trace_dot_v1_dot_trainer__service__pb2.ListTrainingJobsRequest.SerializeToString, trace_dot_v1_dot_trainer__service__pb2.ListTrainingJobsResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def CancelTrainingJob(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.TrainerService/CancelTrainingJob', trace_dot_v1_dot_trainer__service__pb2.CancelTrainingJobRequest.SerializeToString, trace_dot_v1_dot_trainer__service__pb2.CancelTrainingJobResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def ListCheckpoints(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.TrainerService/ListCheckpoints', trace_dot_v1_dot_trainer__service__pb2.ListCheckpointsRequest.SerializeToString, trace_dot_v1_dot_trainer__service__pb2.ListCheckpointsResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)

    @staticmethod
    def ValidateTrainingConfig(request, target, options=(), channel_credentials=None, call_credentials=None, insecure=False, compression=None, wait_for_ready=None, timeout=None, metadata=None):
        return grpc.experimental.unary_unary(request, target, '/trace.v1.TrainerService/ValidateTrainingConfig', trace_dot_v1_dot_trainer__service__pb2.ValidateTrainingConfigRequest.SerializeToString, trace_dot_v1_dot_trainer__service__pb2.ValidateTrainingConfigResponse.FromString, options, channel_credentials, insecure, call_credentials, compression, wait_for_ready, timeout, metadata, _registered_method=True)