"""Wires the rollout service together: domain + servicer + metrics -> ServiceDefinition."""

from __future__ import annotations

from trace_common.grpc.server import ServiceDefinition
from trace_common.proto.trace.v1 import rollout_service_pb2_grpc as pb_grpc

from .metrics import M
from .service import Rollouts
from .servicer import RolloutServicer
from .settings import RolloutSettings


def create_service(settings: RolloutSettings | None = None) -> ServiceDefinition:
    settings = settings or RolloutSettings()
    domain = Rollouts(settings)
    return ServiceDefinition(
        name="rollout", full_names=["trace.v1.RolloutService"], metrics=M,
        add_to_server=lambda server: pb_grpc.add_RolloutServiceServicer_to_server(RolloutServicer(domain), server),
        on_stop=[domain.jobs.shutdown], domain=domain,
    )
