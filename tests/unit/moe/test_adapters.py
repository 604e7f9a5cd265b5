"""Loading PEFT adapters: every mismatch with the base is a clear domain error naming the adapter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from tests.unit.moe.conftest import build_base, save_adapter, tiny_config
from trace_common.errors import FailedPrecondition, InvalidArgument, NotFound
from trace_common.moe import ComposedMoEModel, load_lora_adapter


def _other_hidden(tmp: Path) -> Path:  # trained on a base with hidden size 128
    return save_adapter(build_base(tiny_config("qwen3", hidden=128)), tmp / "wide", seed=1, r=4, lora_alpha=4,
                        target_modules=["q_proj", "v_proj"])


def _more_layers(tmp: Path) -> Path:  # trained on a 4-layer base; layers 2-3 do not exist here
    return save_adapter(build_base(tiny_config("qwen3", layers=4)), tmp / "deep", seed=1, r=4, lora_alpha=4,
                        target_modules=["q_proj"])


def _renamed_module(tmp: Path) -> Path:  # a module name this base does not have
    directory = save_adapter(build_base(tiny_config("qwen3")), tmp / "renamed", seed=1, r=4, lora_alpha=4,
                             target_modules=["q_proj"])
    weights = load_file(str(directory / "adapter_model.safetensors"))
    save_file({k.replace("q_proj", "qkv_fused"): v for k, v in weights.items()},
              str(directory / "adapter_model.safetensors"))
    return directory


def _lm_head(tmp: Path) -> Path:
    return save_adapter(build_base(tiny_config("qwen3")), tmp / "head", seed=1, r=4, lora_alpha=4,
                        target_modules=["lm_head"])


def _embedding(tmp: Path) -> Path:
    return save_adapter(build_base(tiny_config("qwen3")), tmp / "embed", seed=1, r=4, lora_alpha=4,
                        target_modules=["embed_tokens"])


def _dora(tmp: Path) -> Path:
    return save_adapter(build_base(tiny_config("qwen3")), tmp / "dora", seed=1, r=4, lora_alpha=4,
                        target_modules=["q_proj"], use_dora=True)


def _config_edit(name: str, **changes):
    def make(tmp: Path) -> Path:
        directory = save_adapter(build_base(tiny_config("qwen3")), tmp / name, seed=1, r=4, lora_alpha=4,
                                 target_modules=["q_proj"])
        config = json.loads((directory / "adapter_config.json").read_text())
        config.update(changes)
        (directory / "adapter_config.json").write_text(json.dumps(config))
        return directory
    return make


def _missing_weights(tmp: Path) -> Path:
    directory = _config_edit("noweights")(tmp)
    (directory / "adapter_model.safetensors").unlink()
    return directory


def _rank_lie(tmp: Path) -> Path:
    return _config_edit("ranklie", r=8)(tmp)


def _truncated(tmp: Path) -> Path:
    directory = _config_edit("truncated")(tmp)
    weights = load_file(str(directory / "adapter_model.safetensors"))
    save_file({k: v for k, v in weights.items() if "lora_B" not in k}, str(directory / "adapter_model.safetensors"))
    return directory


CASES = [
    # builder, expected error, substrings the message must contain
    (_other_hidden, InvalidArgument, ["'wide'", "q_proj", "hidden size 64", "[4, 128]"]),
    (_more_layers, InvalidArgument, ["'deep'", "model.layers.2.self_attn.q_proj", "does not have"]),
    (_renamed_module, InvalidArgument, ["'renamed'", "qkv_fused", "does not have"]),
    (_lm_head, InvalidArgument, ["'head'", "lm_head", "outside the decoder layers"]),
    (_embedding, InvalidArgument, ["'embed'", "lora_embedding", "not a plain LoRA factor"]),
    (_dora, InvalidArgument, ["'dora'", "DoRA"]),
    (_config_edit("ia3", peft_type="IA3"), InvalidArgument, ["'ia3'", "peft_type 'LORA'", "IA3"]),
    (_config_edit("biased", bias="all"), InvalidArgument, ["'biased'", "bias='all'"]),
    (_config_edit("saver", modules_to_save=["lm_head"]), InvalidArgument, ["'saver'", "modules_to_save"]),
    (_rank_lie, InvalidArgument, ["'ranklie'", "r=8", "disagrees"]),
    (_truncated, InvalidArgument, ["'truncated'", "no lora_B"]),
    (_missing_weights, NotFound, ["'noweights'", "adapter_model.safetensors"]),
    (lambda tmp: tmp / "nowhere", NotFound, ["'nowhere'", "does not exist"]),
]


@pytest.mark.parametrize("builder,error,fragments", CASES, ids=[c[0].__name__ for c in CASES])
def test_mismatched_adapter_is_a_clear_error(tmp_path, builder, error, fragments):
    directory = builder(tmp_path)
    with pytest.raises(error) as caught:
        ComposedMoEModel.from_adapter_dirs(build_base(tiny_config("qwen3")), [directory])
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, message


def test_duplicate_adapter_names_are_rejected(families):
    fam = families["qwen3"]
    with pytest.raises(InvalidArgument, match="distinct adapter names"):
        ComposedMoEModel.from_adapter_dirs(fam.base(), fam.adapter_dirs[:2], names=["same", "same"])


def test_composing_twice_on_one_base_is_rejected(families):
    fam = families["qwen3"]
    base = fam.base()
    first = ComposedMoEModel.from_adapter_dirs(base, fam.adapter_dirs[:1])
    with pytest.raises(FailedPrecondition, match="already carries"):
        ComposedMoEModel.from_adapter_dirs(base, fam.adapter_dirs[:1])
    first.remove()
    ComposedMoEModel.from_adapter_dirs(base, fam.adapter_dirs[:1])  # allowed once removed


@pytest.mark.parametrize("index,expected_targets", [
    (0, 14), (1, 8), (2, 6),  # all-linear (7 x 2 layers), attention (4 x 2), mlp (3 x 2)
])
def test_loaded_adapter_reads_every_factor_with_peft_scaling(families, index, expected_targets):
    fam = families["qwen3"]
    base = fam.base()
    adapter = load_lora_adapter(fam.adapter_dirs[index], base, name=fam.adapter_names[index])
    assert len(adapter.modules) == expected_targets
    peft = fam.peft(index + 1)
    for path, weights in adapter.modules.items():
        lora_layer = peft.get_submodule("base_model.model." + path)
        assert weights.scaling == pytest.approx(lora_layer.scaling["default"])
        assert (weights.lora_A == lora_layer.lora_A["default"].weight).all()
        assert weights.lora_B.abs().sum() > 0
