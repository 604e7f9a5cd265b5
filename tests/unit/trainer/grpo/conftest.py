"""One intra-op thread for the GRPO tests: the machine's cores are shared, and a fixed thread
count keeps float reductions in the same order (the determinism tests rely on it)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
