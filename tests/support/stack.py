"""Fixtures: the embedded stack (five real gRPC servers on loopback port 0) on a background loop.

`embedded_stack` has no auth; `authed_stack` requires a token and a 1 MiB message limit.
Tests talk to them with real blocking gRPC clients; `stack.call(coro)` runs a coroutine on
the servers' event loop (to reach a service's domain object in-process).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from trace_common.grpc.client import Endpoint, open_channel, stub
from tracectl.embedded import EmbeddedStack

TOKEN = "test-token-" + "x" * 16


class RunningStack:
    def __init__(self, root: Path, token: str | None = None, overrides: dict | None = None):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="embedded-stack", daemon=True)
        self.thread.start()
        self.stack = EmbeddedStack(root=root, token=token, overrides=overrides or {})
        self.token = token
        self.call(self.stack.start())
        self.channels: dict[str, object] = {}

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

    def stub(self, service: str, token: str | None | bool = True):
        """A stub with the stack's token (token=True), none (None) or a given one."""
        tok = self.token if token is True else token
        key = f"{service}:{tok}"
        if key not in self.channels:
            self.channels[key] = open_channel(Endpoint(self.targets[service], tok or None))
        return stub(service, self.channels[key])

    def close(self) -> None:
        for ch in self.channels.values():
            ch.close()
        self.call(self.stack.stop(grace=1.0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@pytest.fixture(scope="session")
def embedded_stack(tmp_path_factory) -> Iterator[RunningStack]:
    s = RunningStack(tmp_path_factory.mktemp("embedded"))
    yield s
    s.close()


@pytest.fixture(scope="session")
def authed_stack(tmp_path_factory) -> Iterator[RunningStack]:
    s = RunningStack(tmp_path_factory.mktemp("authed"), token=TOKEN, overrides={"max_message_bytes": 1 << 20})
    yield s
    s.close()
