"""Wires the environment service together: domain + servicer + metrics -> ServiceDefinition."""

from __future__ import annotations

from trace_common.grpc.server import ServiceDefinition
from trace_common.proto.trace.v1 import environment_service_pb2_grpc as pb_grpc

from .metrics import M
from .service import Environments
from .servicer import EnvironmentServicer
from .settings import EnvironmentSettings


def create_service(settings: EnvironmentSettings | None = None) -> ServiceDefinition:
    settings = settings or EnvironmentSettings()
    domain = Environments(settings)
    return ServiceDefinition(
        name="environment", full_names=["trace.v1.EnvironmentService"], metrics=M,
        add_to_server=lambda server: pb_grpc.add_EnvironmentServiceServicer_to_server(EnvironmentServicer(domain), server),
        on_stop=[domain.close], domain=domain,
    )
