"""Health of TRACE services through grpc.health.v1 (what Kubernetes probes also use)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from trace_common.grpc.client import SERVICES, Endpoint, open_channel


@dataclass
class Health:
    service: str
    target: str
    status: str
    latency_ms: float
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "SERVING"


def check(service: str, ep: Endpoint, timeout: float = 5.0) -> Health:
    full = SERVICES[service][3]
    started = time.perf_counter()
    with open_channel(ep) as ch:
        try:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=full),
                                                        timeout=timeout)
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
            detail = ""
        except grpc.RpcError as err:
            status, detail = err.code().name, err.details() or ""
    return Health(service, ep.target, status, (time.perf_counter() - started) * 1000, detail)
