"""Data parallelism on CPU (gloo, 2 processes, as torchrun would start them): each rank plays
half the groups, gradients are summed, so both ranks end with the same adapter, and the metrics
count every group of the batch. With vLLM rollouts (one server, fake_vllm.py) rank 0 alone saves,
loads and unloads each version, and both ranks sample from it (vllm_rollouts.py)."""

from __future__ import annotations

import json
import os

import pytest
import torch.multiprocessing as mp

from tests.support.ports import free_port

pytestmark = pytest.mark.slow


def _rank(rank: int, world: int, port: int, out_dir: str, vllm: dict | None) -> None:
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
    backend = {"rollout_backend": "vllm", "vllm": vllm} if vllm else {}
    cfg = GRPOConfig(max_steps=3, groups_per_batch=4, num_generations=4, max_completion_length=4, learning_rate=5e-3,
                     lora_r=4, save_steps=0, guidance_fraction=0.0, seed=2, early_stop_uninformative_iterations=0,
                     **backend)
    trainer = make_trainer(cfg, warm_model("pick"), tiny_tokenizer(), PickEnv, dist=dist, capability="pick_skill",
                           on_event=lambda k, p: rows.append(p["values"]) if k == "iteration" else None)
    trainer.train(resume=False, write_adapter=False)
    save_file(load(adapter_state_bytes(trainer.model)), f"{out_dir}/rank{rank}.safetensors")
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump({"rows": rows, "served": getattr(trainer.engine, "manager", None) and trainer.engine.manager.current},
                  f)
    dist.close()


def _train(out_dir, vllm: dict | None) -> tuple[list[dict], list[dict], list]:
    mp.start_processes(_rank, args=(2, free_port(), str(out_dir), vllm), nprocs=2, join=True, start_method="spawn")
    from safetensors.torch import load_file

    a, b = load_file(out_dir / "rank0.safetensors"), load_file(out_dir / "rank1.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)      # one adapter on both ranks
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize("backend", ["in_process", "vllm"])
def test_two_ranks_stay_in_sync(tmp_path, backend):
    if backend == "in_process":
        rank0, rank1 = _train(tmp_path, None)
    else:
        from tests.unit.trainer.grpo.fake_vllm import FakeVLLM
        from tests.unit.trainer.grpo.helpers import tiny_tokenizer, warm_model

        tok = tiny_tokenizer()
        (tmp_path / "adapters").mkdir()
        with FakeVLLM(warm_model("pick"), [tok.convert_tokens_to_ids("<|im_end|>")], tok.pad_token_id) as server:
            # the server generates one request at a time on this machine's shared cores: a deadline far above
            # vllm's 30 s default, so a loaded machine makes the test slow, not a policy error
            rank0, rank1 = _train(tmp_path, {"base_url": server.base_url, "adapter_dir": str(tmp_path / "adapters"),
                                             "request_timeout_s": 600})
        versions = int(rank0["rows"][-1]["policy_version"])
        names = [f"pick_skill-v{v}" for v in range(versions + 1)]
        assert server.loads == names                 # each version loaded once (by rank 0), in order
        assert server.unloads == names[:-1]
        assert rank0["served"] == rank1["served"] == names[-1]
        assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == [names[-1]]
        assert [r["policy_errors"] for r in rank0["rows"]] == [0, 0, 0]
        # every episode of both ranks was sampled by the server (the rows count both ranks' episodes; a batch
        # with a failed request, e.g. a connection the test server's small backlog refused, is asked again
        # request by request: rollouts.py, so the server may see a request twice)
        assert len(server.completions) >= sum(r["episodes"] for r in rank0["rows"]) == 3 * 4 * 4
        assert set(server.completions) <= set(names[:-1])
    assert len(rank0["rows"]) == 3
    for r0, r1 in zip(rank0["rows"], rank1["rows"], strict=True):
        assert r0["groups"] == 4 and r0["reward_mean"] == r1["reward_mean"]     # global statistics on both
        assert r0["trained_tokens"] == r1["trained_tokens"]
        assert r0["policy_errors"] == r1["policy_errors"] == 0
    assert rank0["rows"][-1]["policy_version"] >= 1
