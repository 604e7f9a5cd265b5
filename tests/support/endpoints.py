"""Endpoint profiles in tests: allow a local server on the embedded stack, and a listener that
records every TCP connection made to it.

`allowed(stack, url)` is what an operator's TRACE_<SERVICE>_ENDPOINTS does for a deployed
service: the stack's calling services (analysis, environment, rollout) may call `url` as a
profile, for the duration of the block. `Listener` is a real HTTP server on loopback (port 0)
that counts accepted connections -- also those that never send a request -- and records each
request's headers and raw body, answering every POST with one chat completion.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

from tests.support.fake_openai import completion
from tracectl.embedded import CALLERS


@contextmanager
def allowed(stack, base_url: str, *, name: str = "", api_key_env: str = "", models: tuple[str, ...] = (),
            services: tuple[str, ...] = CALLERS) -> Iterator[str]:
    """`stack` (a BackgroundStack) allows `base_url` as a profile while the block runs; yields its name."""
    name = name or f"test-{urlparse(base_url).port}"
    stack.allow_endpoint(name, base_url, api_key_env, models, services)
    try:
        yield name
    finally:
        stack.forbid_endpoint(name, services)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, listener: Listener):
        self.listener = listener
        super().__init__(("127.0.0.1", 0), _Handler)

    def get_request(self):
        conn = super().get_request()
        with self.listener.lock:
            self.listener.connections += 1
        return conn


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args):  # quiet
        pass

    def _record(self, body: bytes) -> None:
        listener = self.server.listener
        with listener.lock:
            listener.requests.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                      "body": body})

    def do_GET(self):  # noqa: N802
        self._record(b"")
        self._reply({"object": "list", "data": []})

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        self._record(body)
        self._reply(completion(self.server.listener.reply))

    def _reply(self, payload: dict) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass


class Listener:
    """A loopback OpenAI-compatible stand-in that records connections and requests (transport only)."""

    def __init__(self, reply: str = "I am sorry, I cannot help with that."):
        self.reply = reply
        self.lock = threading.Lock()
        self.connections = 0
        self.requests: list[dict] = []
        self.server = _Server(self)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/v1"

    def seen(self) -> bytes:
        """Everything requests carried (header lines and bodies), to search for leaked secrets."""
        with self.lock:
            return b"\n".join(b"\n".join(f"{k}: {v}".encode() for k, v in r["headers"].items()) + b"\n" + r["body"]
                              for r in self.requests)

    def authorizations(self) -> set[str]:
        with self.lock:
            return {r["headers"].get("authorization", "") for r in self.requests}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
