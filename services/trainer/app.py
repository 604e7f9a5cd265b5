"""Wires the trainer service together: domain + servicer + metrics -> ServiceDefinition."""

from __future__ import annotations

from trace_common.grpc.server import ServiceDefinition
from trace_common.proto.trace.v1 import trainer_service_pb2_grpc as pb_grpc

from .metrics import M
from .service import Training
from .servicer import TrainerServicer
from .settings import TrainerSettings


def create_service(settings: TrainerSettings | None = None) -> ServiceDefinition:
    settings = settings or TrainerSettings()
    domain = Training(settings)
    return ServiceDefinition(
        name="trainer", full_names=["trace.v1.TrainerService"], metrics=M,
        add_to_server=lambda server: pb_grpc.add_TrainerServiceServicer_to_server(TrainerServicer(domain), server),
        on_stop=[domain.shutdown], domain=domain,
    )
