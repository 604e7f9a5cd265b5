"""A TraceServer start that fails part-way (trace_common/grpc/server.py), on real loopback listeners:
it says which step failed (`starting`, from which tracectl names the flag), runs the stop hooks once
(the inference HTTP API is stopped by one), and leaves none of its ports listening -- grpc cannot
release a port bound by a server it never started, so the gRPC port is bound last."""

from __future__ import annotations

import asyncio
import socket

import pytest

from tests.support.ports import free_port, in_use
from trace_common.config import settings_class
from trace_common.grpc.server import ServiceDefinition, TraceServer
from trace_common.metrics import ServiceMetrics

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("failure, step", [("metrics port busy", "metrics"), ("start hook fails", "hooks"),
                                           ("gRPC port busy", "grpc")])
def test_a_failed_start_stops_what_it_started_and_holds_no_port(tmp_path, failure, step):
    ports = {"grpc": free_port(), "metrics": free_port(), "hook": free_port()}
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    busy = held.getsockname()[1]
    events: list[str] = []

    async def hook_start() -> None:   # stands in for the inference HTTP API: a listener of its own
        events.append("start hook")
        if failure == "start hook fails":
            raise RuntimeError("the hook failed")
        hook_listener.bind(("127.0.0.1", ports["hook"]))
        hook_listener.listen()

    async def hook_stop() -> None:
        events.append("stop hook")
        hook_listener.close()

    hook_listener = socket.socket()
    settings = settings_class("rollout")(
        port=busy if failure == "gRPC port busy" else ports["grpc"],
        metrics_port=busy if failure == "metrics port busy" else ports["metrics"], artifact_root=tmp_path.as_uri())
    definition = ServiceDefinition(name="rollout", full_names=["trace.test.Nothing"], metrics=ServiceMetrics("rollout"),
                                   add_to_server=lambda server: None, on_start=[hook_start], on_stop=[hook_stop])
    server = TraceServer(settings, definition, warn_without_auth=False)
    try:
        with pytest.raises((OSError, RuntimeError)):
            asyncio.run(server.start())
        assert server.starting == step
        assert events == (["stop hook"] if step == "metrics" else ["start hook", "stop hook"])
        asyncio.run(server.stop(grace=0))   # as tracectl does after a refused start: nothing more to stop
        assert events.count("stop hook") == 1
        assert not [name for name, port in ports.items() if in_use(port)]
    finally:
        held.close()
        hook_listener.close()
