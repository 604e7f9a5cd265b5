"""Compositions of the tiny world written to a file artifact store (shared by unit and integration tests)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from tests.unit.inference.tiny import TinyWorld
from trace_common.artifacts import open_store
from trace_common.moe import ComposedMoEModel
from trace_common.moe.composition_io import CompositionArtifact, write_composition


def composed(world: TinyWorld, names=("refunds", "addresses"), gate_scale: float = 0.3, seed: int = 0):
    base = AutoModelForCausalLM.from_pretrained(world.model_dir)
    model = ComposedMoEModel.from_adapter_dirs(base, [world.adapter_dirs[n] for n in names], names=list(names))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for gate in model.gates:  # random gates large enough that routing varies from token to token
            gate.weight.copy_(torch.randn(gate.weight.shape, generator=g) * gate_scale)
            gate.bias.zero_()
    return model


def write_tiny_composition(world: TinyWorld, store_root: Path, prefix: str = "runs/t/moe", **kwargs
                           ) -> CompositionArtifact:
    model = composed(world, **kwargs)
    store = open_store(store_root.as_uri())
    return write_composition(store, prefix, model, base_model=str(world.model_dir),
                             adapter_uris={n: str(world.adapter_dirs[n]) for n in model.adapter_names},
                             routing_share=[0.2, 0.3, 0.5])
