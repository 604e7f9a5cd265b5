from . import analysis_service_pb2
from . import environment_service_pb2
from . import inference_service_pb2
from . import rollout_service_pb2
from . import trainer_service_pb2
from . import types_pb2
