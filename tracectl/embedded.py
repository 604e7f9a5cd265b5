"""The embedded default: all five services in one process on loopback ports, `file://` store.

Used by `tracectl up` and by the test suite's `embedded_stack` fixture. The addresses are
written to `<root>/embedded.json` so `tracectl status` (or any client) can find them.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from services.launch import build
from trace_common.config import SERVICE_NAMES
from trace_common.grpc.client import Endpoint, open_channel, stub
from trace_common.grpc.server import TraceServer


@dataclass
class EmbeddedStack:
    root: Path
    host: str = "127.0.0.1"
    token: str | None = None
    #: Extra settings for every service (e.g. max_message_bytes), over the env vars.
    overrides: dict = field(default_factory=dict)
    servers: dict[str, TraceServer] = field(default_factory=dict)

    @property
    def state_file(self) -> Path:
        return self.root / "embedded.json"

    @property
    def targets(self) -> dict[str, str]:
        return {name: s.target for name, s in self.servers.items()}

    @property
    def metrics_urls(self) -> dict[str, str]:
        return {name: s.metrics_server.url for name, s in self.servers.items() if s.metrics_server}

    @property
    def http_urls(self) -> dict[str, str]:
        """HTTP fronts served beside gRPC (the inference service's OpenAI-compatible API)."""
        return {name: s.definition.http_url for name, s in self.servers.items() if s.definition.http_url}

    async def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        common = {**dict(host=self.host, port=0, metrics_host=self.host, metrics_port=0,
                         artifact_root=self.root.resolve().as_uri(), auth_token=self.token),
                  **self.overrides}  # e.g. an s3:// artifact_root with its S3 settings
        try:
            for name in SERVICE_NAMES:
                extra = {}
                if name == "trainer":  # environments of a run are played through the environment service
                    extra["environment_address"] = self.servers["environment"].target
                settings, definition = build(name, **common, **extra)
                server = TraceServer(settings, definition)
                await server.start()
                self.servers[name] = server
        except BaseException:
            await self.stop()
            raise
        tmp = self.state_file.with_suffix(f".{os.getpid()}.tmp")  # two processes on one root never share it
        tmp.write_text(json.dumps({"pid": os.getpid(), "artifact_root": common["artifact_root"],
                                   "targets": self.targets, "metrics": self.metrics_urls, "http": self.http_urls,
                                   "auth": bool(self.token)}, indent=2))
        os.replace(tmp, self.state_file)

    async def stop(self, grace: float = 2.0) -> None:
        for server in list(self.servers.values())[::-1]:
            await server.stop(grace)
        self.servers.clear()
        try:
            state = json.loads(self.state_file.read_text())
            if state.get("pid") == os.getpid():
                self.state_file.unlink()
        except (OSError, ValueError):
            pass


def read_state(root: Path) -> dict | None:
    try:
        return json.loads((root / "embedded.json").read_text())
    except (OSError, ValueError):
        return None


class BackgroundStack:
    """An EmbeddedStack on its own event-loop thread, for blocking callers (tracectl, tests).

    `stub(service)` gives a real gRPC stub to it; `call(coro)` runs a coroutine on the
    servers' loop (to reach a service's domain object in-process)."""

    def __init__(self, root: Path, token: str | None = None, overrides: dict | None = None):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="embedded-stack", daemon=True)
        self.thread.start()
        self.stack = EmbeddedStack(root=root, token=token, overrides=overrides or {})
        self.token = token
        self.channels: dict[str, object] = {}
        self._channels_lock = threading.Lock()
        try:
            self.call(self.stack.start())
        except BaseException:
            self._stop_loop()
            raise

    def call(self, coro, timeout: float = 60):
        fut: Future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    @property
    def root(self) -> Path:
        return self.stack.root

    @property
    def targets(self) -> dict[str, str]:
        return self.stack.targets

    @property
    def metrics_urls(self) -> dict[str, str]:
        return self.stack.metrics_urls

    def domain(self, service: str):
        return self.stack.servers[service].definition.domain

    def http_url(self, service: str) -> str | None:
        return self.stack.servers[service].definition.http_url

    def stub(self, service: str, token: str | None | bool = True):
        """A stub with the stack's token (token=True), none (None) or the given one."""
        tok = self.token if token is True else token
        key = f"{service}:{tok}"
        with self._channels_lock:  # one channel per key, also when threads ask at once
            if key not in self.channels:
                self.channels[key] = open_channel(Endpoint(self.targets[service], tok or None))
            channel = self.channels[key]
        return stub(service, channel)

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    def close(self) -> None:
        for ch in self.channels.values():
            ch.close()
        self.channels.clear()
        self.call(self.stack.stop(grace=1.0))
        self._stop_loop()

    def __enter__(self) -> BackgroundStack:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
