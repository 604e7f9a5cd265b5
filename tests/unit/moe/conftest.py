"""Tiny random Llama/Qwen3 bases and PEFT LoRA adapters trained on nothing (random non-zero B).

Everything is built in code once per session: a base config + state dict per family, and three
adapters per family that differ in targets, rank and scaling so the composition is exercised on
mixed layouts (all-linear r=4; attention-only r=8 with rsLoRA; MLP-only r=2 with an alpha pattern).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from trace_common.moe import ComposedMoEModel, MoEConfig

VOCAB = 96
ADAPTER_SPECS = (
    ("all_linear", dict(r=4, lora_alpha=8, target_modules="all-linear")),
    ("attention_rslora", dict(r=8, lora_alpha=4, use_rslora=True, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])),
    ("mlp_alpha_pattern", dict(r=2, lora_alpha=2, alpha_pattern={"down_proj": 6},
                               target_modules=["gate_proj", "up_proj", "down_proj"])),
)


def tiny_config(family: str, *, layers: int = 2, hidden: int = 64):
    kwargs = dict(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=256)
    return Qwen3Config(**kwargs) if family == "qwen3" else LlamaConfig(**kwargs)


def build_base(config, state: dict | None = None, seed: int = 0):
    cls = Qwen3ForCausalLM if isinstance(config, Qwen3Config) else LlamaForCausalLM
    torch.manual_seed(seed)
    model = cls(config)
    if state is not None:
        model.load_state_dict(state)
    return model.eval()


def save_adapter(base, directory: Path, seed: int, **lora_kwargs) -> Path:
    """Wrap `base` with a fresh LoRA (random non-zero A and B) and save it in PEFT format."""
    torch.manual_seed(seed)
    peft_model = get_peft_model(base, LoraConfig(init_lora_weights=False, lora_dropout=0.0, **lora_kwargs))
    peft_model.save_pretrained(str(directory))
    return directory


@dataclass
class TinyFamily:
    family: str
    config: object
    state: dict
    adapter_dirs: list[Path]
    adapter_names: list[str]

    def base(self):
        return build_base(self.config, self.state)

    def composed(self, config: MoEConfig | None = None, num_adapters: int | None = None) -> ComposedMoEModel:
        dirs = self.adapter_dirs[:num_adapters]
        return ComposedMoEModel.from_adapter_dirs(self.base(), dirs, names=self.adapter_names[:len(dirs)],
                                                  config=config)

    def peft(self, slot: int):
        """PEFT's own model with adapter `slot` (1-based) active, in eval mode."""
        return PeftModel.from_pretrained(self.base(), str(self.adapter_dirs[slot - 1])).eval()


def _family(family: str, root: Path) -> TinyFamily:
    config = tiny_config(family)
    state = {k: v.clone() for k, v in build_base(config).state_dict().items()}
    dirs = []
    for i, (name, spec) in enumerate(ADAPTER_SPECS):
        dirs.append(save_adapter(build_base(config, state), root / family / name, seed=100 + i, **spec))
    return TinyFamily(family, config, state, dirs, [name for name, _ in ADAPTER_SPECS])


@pytest.fixture(scope="session")
def families(tmp_path_factory) -> dict[str, TinyFamily]:
    root = tmp_path_factory.mktemp("moe_adapters")
    return {family: _family(family, root) for family in ("qwen3", "llama")}


def randomize_gates(model: ComposedMoEModel, seed: int, scale: float = 40.0) -> None:
    """Gates with large random weights so routing varies from token to token in every layer."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for gate in model.gates:
            gate.weight.copy_(torch.randn(gate.weight.shape, generator=generator) * scale / gate.in_features ** 0.5)
            gate.bias.copy_(torch.randn(gate.bias.shape, generator=generator))


def token_batch(batch: int, seq: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))
