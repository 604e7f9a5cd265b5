"""Fixtures: the embedded stack (five real gRPC servers on loopback port 0) on a background loop.

`embedded_stack` has no auth; `authed_stack` requires a token and a 1 MiB message limit.
Both are `tracectl.embedded.BackgroundStack`: `.stub(service)`, `.targets`, `.metrics_urls`,
`.root`, `.domain(service)`, `.call(coro)`.

`embedded_stack` also lists the tau2 test data (the directory $TRACE_TAU2_DATA names,
tests/support/tau2_data.py; none without it) as a data root of the rollout, environment and trainer
services, so requests may name data directories under it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.tau2_data import tau2_data_root
from tracectl.embedded import EMBEDDED_DATA_ROOTS, BackgroundStack

TOKEN = "test-token-" + "x" * 16


@pytest.fixture(scope="session")
def embedded_stack(tmp_path_factory) -> Iterator[BackgroundStack]:
    roots = [root] if (root := tau2_data_root()) else []
    s = BackgroundStack(tmp_path_factory.mktemp("embedded"), overrides={EMBEDDED_DATA_ROOTS: roots})
    yield s
    s.close()


@pytest.fixture(scope="session")
def authed_stack(tmp_path_factory) -> Iterator[BackgroundStack]:
    s = BackgroundStack(tmp_path_factory.mktemp("authed"), token=TOKEN, overrides={"max_message_bytes": 1 << 20})
    yield s
    s.close()
