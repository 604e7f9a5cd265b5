"""Composition artifacts: write -> load round trip, routing modes, and every documented load error."""

from __future__ import annotations

import json

import pytest
import torch

from tests.unit.inference.helpers import composed, write_tiny_composition
from tests.unit.inference.tiny import random_base_dir, save_adapter
from trace_common.artifacts import open_store
from trace_common.errors import InvalidArgument, NotFound, PermissionDenied, TraceError
from trace_common.model_refs import UNCONFINED
from trace_common.moe.composition_io import (
    CompositionManifest,
    load_composition,
    read_manifest,
    save_gates,
)


def test_round_trip_restores_gates_and_manifest(world, tmp_path):
    art = write_tiny_composition(world, tmp_path / "store")
    manifest = read_manifest(art.manifest_uri, allowed=UNCONFINED)
    assert manifest.adapter_names == ["refunds", "addresses"]
    assert (manifest.num_layers, manifest.hidden_size, manifest.num_slots) == (2, 64, 3)
    assert manifest.gate_parameters == 2 * (64 * 3 + 3)
    loaded = load_composition(art.manifest_uri, cache_dir=tmp_path / "cache", allowed=UNCONFINED)
    expected = composed(world).gate_state_dict()
    got = loaded.composed.gate_state_dict()
    assert set(got) == set(expected)
    for key in expected:
        assert torch.equal(got[key], expected[key]), key
    assert loaded.expert_names == ["base", "refunds", "addresses"]
    assert loaded.gate_parameters == manifest.gate_parameters


@pytest.mark.parametrize("routing, merged_adapter, expect_composed, expect_merged", [
    ("token", None, True, None),
    ("per_request", None, True, None),
    ("soft_trajectory", None, True, None),
    ("merged", None, False, "addresses"),   # routing_share [0.2, 0.3, 0.5] -> slot 2
    ("merged", "refunds", False, "refunds"),
])
def test_routing_modes(world, tmp_path, routing, merged_adapter, expect_composed, expect_merged):
    art = write_tiny_composition(world, tmp_path / "store")
    loaded = load_composition(art.manifest_uri, routing=routing, merged_adapter=merged_adapter,
                              cache_dir=tmp_path / "cache", allowed=UNCONFINED)
    assert (loaded.composed is not None) == expect_composed
    assert loaded.merged_adapter == expect_merged
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        logits = loaded.model(input_ids=ids).logits
    assert logits.shape == (1, 4, len(world.tokenizer))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_merging_into_half_precision_weights_is_refused(world, tmp_path, dtype):
    """Half-precision weights cannot hold most of a LoRA delta, so a merged export would serve mostly the
    base: refused naming routing, before anything is loaded; routing token serves the same weights."""
    art = write_tiny_composition(world, tmp_path / "store")
    with pytest.raises(InvalidArgument) as err:
        load_composition(art.manifest_uri, routing="merged", dtype=dtype, cache_dir=tmp_path / "cache",
                         allowed=UNCONFINED)
    assert err.value.reason.startswith("routing") and "merged adapter would be mostly lost" in err.value.reason
    assert not (tmp_path / "cache").exists()
    loaded = load_composition(art.manifest_uri, routing="token", dtype=dtype, cache_dir=tmp_path / "cache",
                              allowed=UNCONFINED)
    assert next(loaded.model.parameters()).dtype == getattr(torch, dtype)


def test_merged_equals_forcing_that_adapter(world, tmp_path):
    """The merged export computes what the composition computes with every token forced to that slot."""
    art = write_tiny_composition(world, tmp_path / "store")
    merged = load_composition(art.manifest_uri, routing="merged", merged_adapter="refunds", cache_dir=tmp_path / "c",
                              allowed=UNCONFINED)
    token = load_composition(art.manifest_uri, cache_dir=tmp_path / "c", allowed=UNCONFINED)
    ids = torch.tensor([[3, 9, 27, 81, 100]])
    with torch.no_grad(), token.composed.forced(1):
        forced = token.model(input_ids=ids).logits
        got = merged.model(input_ids=ids).logits
    assert torch.allclose(got, forced, atol=1e-4)


def _gates_of_other_base(world, tmp_path, *, hidden: int, layers: int):
    from transformers import AutoModelForCausalLM

    from trace_common.moe import ComposedMoEModel

    other = random_base_dir(tmp_path / f"other-{hidden}-{layers}", len(world.tokenizer), hidden=hidden, layers=layers)
    adapter = save_adapter(other, tmp_path / f"other-adapter-{hidden}-{layers}", 3, r=2, lora_alpha=4,
                           target_modules=["q_proj"])
    model = ComposedMoEModel.from_adapter_dirs(AutoModelForCausalLM.from_pretrained(other), [adapter, adapter],
                                               names=["refunds", "addresses"])
    name = f"gates-{hidden}-{layers}.safetensors"  # written through a store: gates are read sha256-verified
    open_store(tmp_path.as_uri()).put_file(name, save_gates(model, tmp_path / "scratch" / name))
    return tmp_path / name, adapter


@pytest.mark.parametrize("case, error, needle", [
    ("gates_hidden_mismatch", InvalidArgument, "hidden size 64"),
    ("gates_layers_mismatch", InvalidArgument, "2 layers"),
    ("unknown_adapter", InvalidArgument, "unknown adapter(s) ['shipping']"),
    ("adapter_of_other_base", InvalidArgument, "different base"),
    ("missing_base", PermissionDenied, "built-in base agent (micro"),
    ("base_config_unknown_type", InvalidArgument, "base_model: expected a Hugging Face model directory"),
    ("base_config_not_json", InvalidArgument, "base_model: expected a Hugging Face model directory"),
    ("gates_without_digest", TraceError, "no valid sha256"),
    ("missing_gates_file", NotFound, "does not exist"),
    ("gates_not_safetensors", InvalidArgument, "not a readable safetensors"),
    ("two_adapters_no_gates", InvalidArgument, "gates for a composition of 2 adapters"),
    ("soft_one_adapter_no_gates", InvalidArgument, "soft_trajectory routing weights the adapters by the gates"),
])
def test_load_errors_name_the_problem(world, tmp_path, case, error, needle):
    art = write_tiny_composition(world, tmp_path / "store")
    adapters = [(n, str(world.adapter_dirs[n])) for n in ("refunds", "addresses")]
    kwargs = dict(base_model=str(world.model_dir), adapters=adapters, gates_uri=art.gates_uri)
    if case == "gates_hidden_mismatch":
        kwargs["gates_uri"] = str(_gates_of_other_base(world, tmp_path, hidden=128, layers=2)[0])
    elif case == "gates_layers_mismatch":
        kwargs["gates_uri"] = str(_gates_of_other_base(world, tmp_path, hidden=64, layers=3)[0])
    elif case == "unknown_adapter":
        kwargs["adapters"] = [adapters[0], ("shipping", adapters[1][1])]
    elif case == "adapter_of_other_base":
        _, other_adapter = _gates_of_other_base(world, tmp_path, hidden=128, layers=2)
        kwargs["adapters"] = [adapters[0], ("addresses", str(other_adapter))]
    elif case == "missing_base":
        kwargs["base_model"] = "no-such-model"
    elif case == "missing_gates_file":
        kwargs["gates_uri"] = (tmp_path / "nope.safetensors").as_uri()
    elif case == "gates_not_safetensors":
        kwargs["gates_uri"] = open_store(tmp_path.as_uri()).put_bytes("bad.safetensors", b"this is not a tensor").uri
    elif case == "gates_without_digest":  # a file no store wrote is never used in place
        bare = tmp_path / "bare.safetensors"
        bare.write_bytes((tmp_path / "store" / "runs/t/moe/gates.safetensors").read_bytes())
        kwargs["gates_uri"] = str(bare)
    elif case.startswith("base_config_"):
        import shutil

        bad_base = tmp_path / "bad-base"
        shutil.copytree(world.model_dir, bad_base)
        (bad_base / "config.json").write_text('{"model_type": "no-such-architecture"}' if case.endswith("type")
                                              else "this is not JSON")
        kwargs.update(base_model=str(bad_base), adapters=[], gates_uri="")
    elif case == "two_adapters_no_gates":
        kwargs["gates_uri"] = ""
    elif case == "soft_one_adapter_no_gates":
        kwargs.update(adapters=adapters[:1], gates_uri="", routing="soft_trajectory")
    with pytest.raises(error) as err:
        load_composition(cache_dir=tmp_path / "cache", allowed=UNCONFINED, **kwargs)
    assert needle in str(err.value)
    assert isinstance(err.value, TraceError)


def test_single_adapter_without_gates_routes_everything_to_it(world, tmp_path):
    loaded = load_composition(base_model=str(world.model_dir), adapters=[("refunds", str(world.adapter_dirs["refunds"]))],
                              cache_dir=tmp_path / "cache", allowed=UNCONFINED)
    with torch.no_grad(), loaded.composed.capture_routing() as trace:
        loaded.model(input_ids=torch.tensor([[1, 2, 3]]))
    assert set(trace.experts().unique().tolist()) == {1}


def test_manifest_rejects_duplicate_or_reserved_names():
    entry = {"name": "base", "uri": "/x"}
    with pytest.raises(ValueError, match="distinct and not 'base'"):
        CompositionManifest.model_validate({"base_model": "m", "adapters": [entry], "gates_uri": "/g",
                                            "hidden_size": 1, "num_layers": 1, "num_slots": 2, "gate_parameters": 4})


def test_corrupted_gates_in_store_are_refused(world, tmp_path):
    from trace_common.errors import ArtifactCorrupted

    art = write_tiny_composition(world, tmp_path / "store")
    path = tmp_path / "store" / "runs/t/moe/gates.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactCorrupted):
        load_composition(art.manifest_uri, cache_dir=tmp_path / "cache", allowed=UNCONFINED)
    assert json.loads((tmp_path / "store" / "runs/t/moe/composition.json").read_text())["num_slots"] == 3
