"""Data parallelism across the processes of one training job (torchrun, one process per GPU).

Why not `DistributedDataParallel`: each rank also generates rollouts with the same model
between optimizer steps, and only the LoRA tensors have gradients; averaging those few
gradients by hand after the backward pass is simpler and equivalent. Each rank plays the
groups g with g % world == rank; the loss is normalised by the global token count, so the
summed gradients equal the single-process gradient of the whole batch.

Semantics:
    init(): torch.distributed.init_process_group(nccl on CUDA, gloo on CPU) when WORLD_SIZE > 1
    all_sum(x) = sum over ranks of x       (tensors or floats)
    sync_grads(params): p.grad = sum over ranks of p.grad
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch


class Dist:
    def __init__(self) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self._initialised = False

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def init(self) -> None:
        if not self.enabled or self._initialised:
            return
        import torch.distributed as dist

        if not dist.is_initialized():
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            if backend == "nccl":
                torch.cuda.set_device(self.local_rank)
            dist.init_process_group(backend=backend)
        self._initialised = True

    @property
    def device(self) -> torch.device:
        if torch.cuda.is_available():
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    def all_sum_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """Sum `t` over ranks in place (NCCL needs CUDA tensors: CPU ones travel through the GPU)."""
        if not self.enabled:
            return t
        import torch.distributed as dist

        dev = self.device
        if t.device.type != dev.type:
            moved = t.to(dev)
            dist.all_reduce(moved, op=dist.ReduceOp.SUM)
            t.copy_(moved.to(t.device))
            return t
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def all_sum(self, values: list[float]) -> list[float]:
        if not self.enabled:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64)
        return self.all_sum_tensor(t).tolist()

    def sync_grads(self, params: Iterable[torch.nn.Parameter]) -> None:
        if not self.enabled:
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            self.all_sum_tensor(p.grad)

    def barrier(self) -> None:
        if self.enabled:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        if self.enabled and self._initialised:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
