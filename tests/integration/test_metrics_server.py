"""The /metrics endpoint (`trace_common.metrics.MetricsServer`) on loopback: the bearer-token rule
(the same as the gRPC calls', `trace_common.grpc.auth`), HTTPS with the service's TLS pair, and a
client that connects and never speaks holding up no other scrape."""

from __future__ import annotations

import http.client
import socket
import time

import pytest
from prometheus_client import CollectorRegistry, Counter

from tests.support.tls import self_signed, trusting
from trace_common.metrics import MetricsServer

pytestmark = pytest.mark.integration

TOKEN = "metrics-token-" + "y" * 16


@pytest.fixture
def registry() -> CollectorRegistry:
    r = CollectorRegistry()
    Counter("trace_test_scrapes", "A counter to find in the exposition.", registry=r).inc()
    return r


def _get(server: MetricsServer, header: str | None, context=None) -> http.client.HTTPResponse:
    cls = http.client.HTTPSConnection if context is not None else http.client.HTTPConnection
    conn = cls(server.host, server.port, timeout=10, **({"context": context} if context is not None else {}))
    conn.request("GET", "/metrics", headers={"Authorization": header} if header is not None else {})
    resp = conn.getresponse()
    resp.body = resp.read().decode()  # type: ignore[attr-defined]
    conn.close()
    return resp


@pytest.mark.parametrize(("token", "header", "status"), [
    (None, None, 200),                          # no token configured: open, as every surface then
    (None, "Bearer anything", 200),
    (TOKEN, None, 401),
    (TOKEN, "Bearer wrong-token", 401),
    (TOKEN, TOKEN, 401),                        # the token without its scheme
    (TOKEN, f"Basic {TOKEN}", 401),
    (TOKEN, f"Bearer {TOKEN}x", 401),
    (TOKEN, f"Bearer {TOKEN}", 200),
    (TOKEN, f"bearer   {TOKEN}", 200),          # scheme in any case, spaces after it (the gRPC rule)
])
def test_the_token_rule(registry, token, header, status):
    server = MetricsServer(registry, "127.0.0.1", 0, token=token)
    try:
        resp = _get(server, header)
        assert resp.status == status, resp.body
        if status == 200:
            assert "trace_test_scrapes_total 1.0" in resp.body
        else:
            assert resp.getheader("WWW-Authenticate", "").startswith("Bearer")
            assert "trace_test" not in resp.body and TOKEN not in resp.body
            assert ("missing" if header is None else "invalid bearer token") in resp.body
        assert server.url == f"http://127.0.0.1:{server.port}/metrics" and server.authenticated is (token is not None)
    finally:
        server.stop()


def test_head_gets_the_headers_only(registry):
    server = MetricsServer(registry, "127.0.0.1", 0, token=TOKEN)
    try:
        conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
        conn.request("HEAD", "/metrics")
        resp = conn.getresponse()
        assert resp.status == 401 and resp.read() == b""
        conn.close()
        with socket.create_connection((server.host, server.port), timeout=10) as raw:  # nothing after headers
            raw.sendall(b"HEAD /metrics HTTP/1.0\r\n\r\n")
            reply = b""
            while chunk := raw.recv(4096):
                reply += chunk
        assert reply.startswith(b"HTTP/1.0 401") and reply.endswith(b"\r\n\r\n"), reply
    finally:
        server.stop()


def test_with_tls_it_is_https_only_and_a_silent_client_blocks_no_scrape(registry, tmp_path, capfd):
    cert, key = self_signed(tmp_path)
    server = MetricsServer(registry, "127.0.0.1", 0, token=TOKEN, tls=(cert, key))
    silent = socket.create_connection((server.host, server.port), timeout=10)  # never sends its ClientHello
    try:
        assert server.url.startswith("https://")
        started = time.monotonic()
        assert _get(server, f"Bearer {TOKEN}", trusting(cert)).status == 200
        assert time.monotonic() - started < 5  # served beside the silent connection, not after its timeout
        assert _get(server, None, trusting(cert)).status == 401
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            _get(server, f"Bearer {TOKEN}")  # plain HTTP on the TLS port
    finally:
        silent.close()
        server.stop()
    assert "Traceback" not in capfd.readouterr().err  # a failed connection is a debug line, not stderr noise


def test_an_ipv6_host_gives_a_url_that_reaches_it(registry):
    try:
        server = MetricsServer(registry, "::1", 0)
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    try:
        assert server.url == f"http://[::1]:{server.port}/metrics"
        conn = http.client.HTTPConnection("::1", server.port, timeout=10)
        conn.request("GET", "/metrics")
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        server.stop()
