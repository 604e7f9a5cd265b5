"""Wires the environment service together: domain + servicer + metrics -> ServiceDefinition.

Calibration plays the real base agent: `ModelCalibration` opens IN_PROCESS and OPENAI_HTTP
calibration policies with the shared policy factory (calibration_policy.py)."""

from __future__ import annotations

from trace_common.grpc.server import ServiceDefinition
from trace_common.model_refs import ModelRoots
from trace_common.proto.trace.v1 import environment_service_pb2_grpc as pb_grpc

from .calibration_policy import ModelCalibration
from .metrics import M
from .service import Environments
from .servicer import EnvironmentServicer
from .settings import EnvironmentSettings


def create_service(settings: EnvironmentSettings | None = None) -> ServiceDefinition:
    settings = settings or EnvironmentSettings()
    calibration = ModelCalibration(settings.calibration_sampling(), s3=settings.s3_settings(),
                                   allowed=ModelRoots.of(settings))
    domain = Environments(settings, calibration_factories=calibration)
    return ServiceDefinition(
        name="environment", full_names=["trace.v1.EnvironmentService"], metrics=M,
        add_to_server=lambda server: pb_grpc.add_EnvironmentServiceServicer_to_server(EnvironmentServicer(domain), server),
        on_stop=[domain.close], domain=domain,
    )
