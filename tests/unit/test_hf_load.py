"""load_causal_lm from several threads at once: every model comes out whole (no meta tensor, every
weight equal to a load done alone). Without the lock, transformers' process-wide loading patches
leaked between threads: a composition loaded beside a plain model had meta weights."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from trace_common.agents.shipped_files import shipped_dir
from trace_common.hf_load import load_causal_lm

MICRO = shipped_dir("micro")


@pytest.mark.parametrize("threads, loads", [(2, 4), (4, 6)])
def test_concurrent_loads_give_whole_models(threads, loads):
    alone = {k: v.clone() for k, v in load_causal_lm(MICRO).state_dict().items()}
    with ThreadPoolExecutor(threads) as pool:
        models = list(pool.map(lambda _: load_causal_lm(MICRO), range(loads)))
    for model in models:
        state = model.state_dict()
        assert not any(t.is_meta for t in state.values())
        assert state.keys() == alone.keys() and all(torch.equal(state[k], alone[k]) for k in alone)
