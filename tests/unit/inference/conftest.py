"""Fixtures: the tiny world (tests/unit/inference/tiny.py) and compositions written to a file store."""

from __future__ import annotations

import pytest
import torch

from tests.unit.inference.tiny import TinyWorld, cached_world


@pytest.fixture(scope="session")
def world() -> TinyWorld:
    return cached_world()


@pytest.fixture(autouse=True)
def _single_thread():
    """Tiny models run ~10x faster single-threaded on this shared 2-core machine (thread contention)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
