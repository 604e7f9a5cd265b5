"""Wires the inference service together: domain + servicer + metrics + OpenAI HTTP -> ServiceDefinition."""

from __future__ import annotations

from trace_common.grpc.server import ServiceDefinition
from trace_common.proto.trace.v1 import inference_service_pb2_grpc as pb_grpc

from .metrics import M
from .openai_http import OpenAIServer
from .service import Inference
from .servicer import InferenceServicer
from .settings import InferenceSettings


def create_service(settings: InferenceSettings | None = None) -> ServiceDefinition:
    settings = settings or InferenceSettings()
    domain = Inference(settings)
    token = settings.auth_token.get_secret_value() if settings.auth_token is not None else None
    # the HTTP front, around the domain, requiring the same token as gRPC and serving the same TLS
    http = OpenAIServer(domain, settings.http_host, settings.http_port, token=token, tls=settings.tls_pair,
                        max_in_flight=settings.max_concurrent_rpcs)
    return ServiceDefinition(
        name="inference", full_names=["trace.v1.InferenceService"], metrics=M,
        add_to_server=lambda server: pb_grpc.add_InferenceServiceServicer_to_server(InferenceServicer(domain), server),
        on_start=[http.start], on_stop=[http.stop, domain.stop], domain=domain, http=http,
    )
