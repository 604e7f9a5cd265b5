"""Loopback ports for servers the tests start (Prometheus, MinIO, vLLM, torch.distributed's rendezvous)."""

from __future__ import annotations

import socket

from trace_common.errors import FailedPrecondition
from tracectl.rehearsal.local import free_ports


def free_port() -> int:
    """A loopback port, free now, for a server started after this returns (Prometheus, MinIO, vLLM).

    Drawn from outside the kernel's ephemeral range (`free_ports`), not by a bind to port 0: until the
    server binds it (vLLM: some 30 s later) the kernel may hand a port from that range to any socket,
    the server's own included; that is how a CI rehearsal lost a port (tracectl/rehearsal/local.py).
    A host whose ephemeral range leaves no room outside it gets a bind to port 0, as before."""
    try:
        return free_ports(1)[0]
    except FailedPrecondition:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]


def in_use(port: int) -> bool:
    """Whether something holds loopback `port`: a plain bind (no SO_REUSEPORT) fails while any listener
    does, or a socket lingers on it."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def closed_port() -> int:
    """A loopback port nothing listens on, for a test of a server that cannot be reached (outside the
    ephemeral range, so no outgoing connection of the test's own takes it meanwhile)."""
    return free_port()
