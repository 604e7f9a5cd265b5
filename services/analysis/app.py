"""Wires the analysis service together: domain + servicer + metrics -> ServiceDefinition."""

from __future__ import annotations

from trace_common.grpc.server import ServiceDefinition
from trace_common.proto.trace.v1 import analysis_service_pb2_grpc as pb_grpc

from .metrics import M
from .service import Analyses
from .servicer import AnalysisServicer
from .settings import AnalysisSettings


def create_service(settings: AnalysisSettings | None = None) -> ServiceDefinition:
    settings = settings or AnalysisSettings()
    domain = Analyses(settings)
    return ServiceDefinition(
        name="analysis", full_names=["trace.v1.AnalysisService"], metrics=M,
        add_to_server=lambda server: pb_grpc.add_AnalysisServiceServicer_to_server(AnalysisServicer(domain), server),
        on_stop=[domain.jobs.shutdown], domain=domain,
    )
