"""Data parallelism on CPU (gloo, 2 processes, as torchrun would start them): each rank plays
half the groups, gradients are summed, so both ranks end with the same adapter, and the metrics
count every group of the batch."""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch.multiprocessing as mp

pytestmark = pytest.mark.slow


def _rank(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    import torch

    torch.set_num_threads(1)
    from safetensors.torch import load, save_file

    from services.trainer.grpo.config import GRPOConfig
    from services.trainer.grpo.distributed import Dist
    from services.trainer.grpo.lora import adapter_state_bytes
    from services.trainer.grpo.session import make_trainer
    from tests.unit.trainer.grpo.helpers import PickEnv, tiny_tokenizer, warm_model

    dist = Dist()
    dist.init()
    rows = []
    cfg = GRPOConfig(max_steps=3, groups_per_batch=4, num_generations=4, max_completion_length=4, learning_rate=5e-3,
                     lora_r=4, save_steps=0, guidance_fraction=0.0, seed=2, early_stop_uninformative_iterations=0)
    trainer = make_trainer(cfg, warm_model("pick"), tiny_tokenizer(), PickEnv, dist=dist,
                           on_event=lambda k, p: rows.append(p["values"]) if k == "iteration" else None)
    trainer.train(resume=False, write_adapter=False)
    save_file(load(adapter_state_bytes(trainer.model)), f"{out_dir}/rank{rank}.safetensors")
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(rows, f)
    dist.close()


def test_two_ranks_stay_in_sync(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_rank, args=(2, port, str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    from safetensors.torch import load_file

    a, b = load_file(tmp_path / "rank0.safetensors"), load_file(tmp_path / "rank1.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    rows0 = json.loads((tmp_path / "rank0.json").read_text())
    rows1 = json.loads((tmp_path / "rank1.json").read_text())
    assert len(rows0) == 3
    for r0, r1 in zip(rows0, rows1, strict=True):
        assert r0["groups"] == 4 and r0["reward_mean"] == r1["reward_mean"]     # global statistics on both
        assert r0["trained_tokens"] == r1["trained_tokens"]
    assert rows0[-1]["policy_version"] >= 1
