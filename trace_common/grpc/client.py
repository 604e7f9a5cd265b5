"""Client channels to TRACE services: a deadline on every call, retries only where safe.

Both are set through gRPC's service config, so they hold for every stub built on the channel
(no call site can forget them):
  * every method has a default `timeout` (Watch* long, Generate* medium, the rest short);
    a caller may pass a shorter `timeout=` per call;
  * `retryPolicy` (UNAVAILABLE only, exponential backoff) is attached to idempotent methods:
    Get*, List*, Watch*, Cancel*, Create* (the client always sends a `request_id`, which the
    server de-duplicates), health checks. Generate*, episode steps and loads are never retried.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc import aio

from trace_common.proto.trace.v1 import (
    analysis_service_pb2,
    analysis_service_pb2_grpc,
    environment_service_pb2,
    environment_service_pb2_grpc,
    inference_service_pb2,
    inference_service_pb2_grpc,
    rollout_service_pb2,
    rollout_service_pb2_grpc,
    trainer_service_pb2,
    trainer_service_pb2_grpc,
)

#: service name -> (pb2 module, pb2_grpc module, stub class name, full service name)
SERVICES = {
    "rollout": (rollout_service_pb2, rollout_service_pb2_grpc, "RolloutServiceStub", "trace.v1.RolloutService"),
    "analysis": (analysis_service_pb2, analysis_service_pb2_grpc, "AnalysisServiceStub", "trace.v1.AnalysisService"),
    "environment": (environment_service_pb2, environment_service_pb2_grpc, "EnvironmentServiceStub",
                    "trace.v1.EnvironmentService"),
    "trainer": (trainer_service_pb2, trainer_service_pb2_grpc, "TrainerServiceStub", "trace.v1.TrainerService"),
    "inference": (inference_service_pb2, inference_service_pb2_grpc, "InferenceServiceStub",
                  "trace.v1.InferenceService"),
}

IDEMPOTENT_PREFIXES = ("Get", "List", "Watch", "Cancel", "Create")
RETRY_POLICY = {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "2s", "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"]}


def default_timeout(method: str) -> float:
    if method.startswith("Watch"):
        return 3600.0
    if method.startswith(("Generate", "LoadComposition")):
        return 300.0
    return 30.0


def service_config() -> dict:
    configs = []
    for _svc, (pb2, _g, _stub, full) in SERVICES.items():
        desc = pb2.DESCRIPTOR.services_by_name[full.rsplit(".", 1)[1]]
        for m in desc.methods:
            cfg: dict = {"name": [{"service": full, "method": m.name}], "timeout": f"{default_timeout(m.name)}s"}
            if m.name.startswith(IDEMPOTENT_PREFIXES):
                cfg["retryPolicy"] = RETRY_POLICY
            configs.append(cfg)
    configs.append({"name": [{"service": "grpc.health.v1.Health", "method": "Check"}], "timeout": "5s",
                    "retryPolicy": RETRY_POLICY})
    return {"methodConfig": configs}


def channel_options(max_message_bytes: int = 16 * 1024 * 1024) -> list[tuple[str, object]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", json.dumps(service_config())),
    ]


@dataclass(frozen=True)
class Endpoint:
    """Where a service is and how to reach it."""

    target: str
    token: str | None = None
    tls_ca_file: Path | None = None


def _credentials(ep: Endpoint) -> grpc.ChannelCredentials | None:
    if ep.tls_ca_file is None:
        return None
    return grpc.ssl_channel_credentials(root_certificates=ep.tls_ca_file.read_bytes())


class _AuthMetadata(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call (sync channels)."""

    def __init__(self, token: str):
        self._md = ("authorization", f"Bearer {token}")

    def _details(self, d):
        md = list(d.metadata or []) + [self._md]
        return d._replace(metadata=md) if hasattr(d, "_replace") else _Details(d, md)

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)


class _Details(grpc.ClientCallDetails):
    def __init__(self, d, metadata):
        self.method, self.timeout, self.metadata = d.method, d.timeout, metadata
        self.credentials = d.credentials
        self.wait_for_ready = getattr(d, "wait_for_ready", None)
        self.compression = getattr(d, "compression", None)


def open_channel(ep: Endpoint, max_message_bytes: int = 16 * 1024 * 1024) -> grpc.Channel:
    """A blocking channel (tracectl, tests). Close it when done."""
    creds = _credentials(ep)
    opts = channel_options(max_message_bytes)
    ch = grpc.secure_channel(ep.target, creds, opts) if creds else grpc.insecure_channel(ep.target, opts)
    if ep.token:
        ch = grpc.intercept_channel(ch, _AuthMetadata(ep.token))
    return ch


def open_aio_channel(ep: Endpoint, max_message_bytes: int = 16 * 1024 * 1024) -> aio.Channel:
    """An asyncio channel (service-to-service calls). Token via per-call metadata: `call_metadata(ep)`."""
    creds = _credentials(ep)
    opts = channel_options(max_message_bytes)
    return aio.secure_channel(ep.target, creds, opts) if creds else aio.insecure_channel(ep.target, opts)


def call_metadata(ep: Endpoint) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {ep.token}"),) if ep.token else ()


def stub(service: str, channel):
    """The generated stub of `service` on `channel`."""
    _pb2, grpc_mod, stub_name, _full = SERVICES[service]
    return getattr(grpc_mod, stub_name)(channel)


def messages(service: str):
    """The pb2 module of `service` (request/response classes)."""
    return SERVICES[service][0]


def new_request_id() -> str:
    return uuid.uuid4().hex
