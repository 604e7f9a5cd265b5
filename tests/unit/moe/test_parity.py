"""Numerical parity of the composed model against PEFT, the plain base and the reference path."""

from __future__ import annotations

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file, save_file

from tests.unit.moe.conftest import build_base, randomize_gates, save_adapter, token_batch
from trace_common.moe import ComposedMoEModel, MoEConfig

TOL = 1e-5
FAMILIES = ["qwen3", "llama"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("slot", [1, 2, 3])
def test_forced_slot_matches_peft_adapter(families, family, slot):
    fam = families[family]
    model = fam.composed()
    ids = token_batch(2, 11, seed=slot)
    with torch.no_grad(), model.forced(slot):
        ours = model(input_ids=ids).logits
    with torch.no_grad():
        theirs = fam.peft(slot)(input_ids=ids).logits
        plain = fam.base()(input_ids=ids).logits
    assert (ours - plain).abs().max() > 1e-3  # the adapter really changes the output
    assert (ours - theirs).abs().max().item() <= TOL


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("forcing", ["slot0", "per_layer_zeros", "removed"])
def test_base_slot_and_removal_match_plain_base(families, family, forcing):
    fam = families[family]
    model = fam.composed()
    ids = token_batch(3, 9, seed=7)
    with torch.no_grad():
        if forcing == "slot0":
            with model.forced(0):
                ours = model(input_ids=ids).logits
        elif forcing == "per_layer_zeros":
            with model.forced([0] * model.num_layers):
                ours = model(input_ids=ids).logits
        else:
            ours = model.remove()(input_ids=ids).logits
        plain = fam.base()(input_ids=ids).logits
    assert (ours - plain).abs().max().item() <= TOL


def _splice_adapter(fam, tmp_path, per_layer_slots):
    """A PEFT adapter whose layer l holds the factors of adapter per_layer_slots[l] (same r/alpha)."""
    source = load_file(str(fam.adapter_dirs[0] / "adapter_model.safetensors"))
    donors = {slot: load_file(str(fam.adapter_dirs[0].parent / f"donor{slot}" / "adapter_model.safetensors"))
              for slot in set(per_layer_slots)}
    spliced = {}
    for key in source:
        layer = int(key.split(".layers.")[1].split(".")[0])
        spliced[key] = donors[per_layer_slots[layer]][key]
    out = tmp_path / "spliced"
    out.mkdir()
    save_file(spliced, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text((fam.adapter_dirs[0] / "adapter_config.json").read_text())
    return out


@pytest.mark.parametrize("per_layer", [(1, 2), (2, 1), (0, 3), (3, 0)])
def test_per_layer_forcing_matches_spliced_peft_adapter(families, tmp_path, per_layer):
    """Forcing layer l to slot per_layer[l] == one PEFT adapter built from those layers' factors."""
    fam = families["qwen3"]
    donors_dir = fam.adapter_dirs[0].parent
    dirs = []
    for slot in (1, 2, 3):  # three same-shaped all-linear adapters so layers can be spliced
        directory = donors_dir / f"donor{slot}"
        if not directory.exists():
            save_adapter(build_base(fam.config, fam.state), directory, seed=500 + slot, r=4, lora_alpha=8,
                         target_modules="all-linear")
        dirs.append(directory)
    # slot 0 in a layer == no LoRA there: splice a zero adapter for that layer
    zero_dir = donors_dir / "donor0"
    if not zero_dir.exists():
        zero_dir.mkdir()
        weights = load_file(str(dirs[0] / "adapter_model.safetensors"))
        save_file({k: torch.zeros_like(v) for k, v in weights.items()}, str(zero_dir / "adapter_model.safetensors"))
        (zero_dir / "adapter_config.json").write_text((dirs[0] / "adapter_config.json").read_text())
    model = ComposedMoEModel.from_adapter_dirs(fam.base(), dirs, names=["d1", "d2", "d3"])
    ids = token_batch(2, 10, seed=3)
    with torch.no_grad(), model.forced(list(per_layer)):
        ours = model(input_ids=ids).logits
    spliced = _splice_adapter(fam, tmp_path, per_layer)
    with torch.no_grad():
        theirs = PeftModel.from_pretrained(fam.base(), str(spliced)).eval()(input_ids=ids).logits
    assert (ours - theirs).abs().max().item() <= TOL


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("num_adapters,seed", [(1, 0), (2, 1), (3, 2), (3, 3)])
def test_grouped_matches_reference_under_random_routing(families, family, num_adapters, seed):
    fam = families[family]
    traces, logits = {}, {}
    for impl in ("grouped", "reference"):
        model = fam.composed(MoEConfig(implementation=impl), num_adapters=num_adapters)
        randomize_gates(model, seed)
        with torch.no_grad(), model.capture_routing() as trace:
            logits[impl] = model(input_ids=token_batch(3, 13, seed=seed)).logits
        traces[impl] = trace.experts()
    routing = traces["grouped"]  # [L, B, T]
    for layer in range(routing.shape[0]):  # the case is only meaningful if routing really mixes slots
        assert routing[layer].unique().numel() >= min(2, num_adapters + 1)
    assert torch.equal(traces["grouped"], traces["reference"])
    assert (logits["grouped"] - logits["reference"]).abs().max().item() <= TOL


def _position_schedule(num_layers: int, seq: int, num_slots: int, kind: str) -> torch.Tensor:
    positions = torch.arange(seq)
    if kind == "switch_midway":  # every layer: slot 1 for the first half, slot 2 after
        row = torch.where(positions < seq // 2, 1, 2)
        return row.expand(num_layers, seq).clone()
    if kind == "cycle":  # slot changes at every position, shifted per layer
        return torch.stack([(positions + layer) % num_slots for layer in range(num_layers)])
    generator = torch.Generator().manual_seed(11)
    return torch.randint(0, num_slots, (num_layers, seq), generator=generator)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["switch_midway", "cycle", "random"])
def test_schedule_changing_mid_sequence_matches_token_by_token_reference(families, family, kind):
    fam = families[family]
    seq = 12
    ids = token_batch(2, seq, seed=5)
    fast = fam.composed()
    schedule = _position_schedule(fast.num_layers, seq, fast.num_slots, kind)  # [L, P]
    with torch.no_grad(), fast.forced(schedule), fast.capture_routing() as trace:
        full = fast(input_ids=ids).logits  # [B, T, V]
    assert torch.equal(trace.experts(), schedule.unsqueeze(1).expand(-1, 2, -1))

    oracle = fam.composed(MoEConfig(implementation="reference"))
    stepwise, cache = [], None
    with torch.no_grad(), oracle.forced(schedule):
        for t in range(seq):
            out = oracle(input_ids=ids[:, t:t + 1], cache=cache, use_cache=True)
            cache = out.past_key_values  # the returned cache, fed back as `cache`
            stepwise.append(out.logits[:, -1])
    assert (full - torch.stack(stepwise, dim=1)).abs().max().item() <= TOL
    if kind == "switch_midway":  # causal: the first half sees only adapter 1, exactly PEFT's adapter 1
        with torch.no_grad():
            peft_first = fam.peft(1)(input_ids=ids[:, : seq // 2]).logits
        assert (full[:, : seq // 2] - peft_first).abs().max().item() <= TOL


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("padded", [False, True])
def test_generate_with_kv_cache_matches_full_forward(families, family, padded):
    fam = families[family]
    model = fam.composed()
    randomize_gates(model, seed=4)
    ids = token_batch(2, 8, seed=9)
    mask = torch.ones_like(ids)
    if padded:  # left padding of the second prompt, as a batched server does
        mask[1, :3] = 0
    new = 6
    with torch.no_grad(), model.capture_routing() as gen_trace:
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                             do_sample=False, output_logits=True, return_dict_in_generate=True,
                             pad_token_id=0)
    sequences = gen.sequences  # [B, 8 + new]
    full_mask = torch.cat([mask, torch.ones(2, new, dtype=mask.dtype)], dim=1)
    position_ids = (full_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad(), model.capture_routing() as full_trace:
        full = model(input_ids=sequences, attention_mask=full_mask, position_ids=position_ids,
                     use_cache=False).logits
    cached = torch.stack(gen.logits, dim=1)  # [B, new, V]
    assert (full[:, ids.shape[1] - 1:-1] - cached).abs().max().item() <= TOL
    processed = sequences.shape[1] - 1  # generate never feeds its last token back in
    keep = full_mask[:, :processed].bool()  # [B, T]
    assert torch.equal(gen_trace.experts()[:, keep], full_trace.experts()[:, :, :processed][:, keep])
    assert gen_trace.experts().unique().numel() >= 2  # routing really varies across tokens


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.bfloat16, 1e-2)])
def test_dtype_conversion_keeps_parity(families, dtype, tol):
    """`.to(dtype)` after composition re-points the experts at the converted weights."""
    fam = families["qwen3"]
    model = fam.composed().to(dtype)
    randomize_gates(model, seed=1)
    ids = token_batch(2, 8, seed=2)
    with torch.no_grad():
        with model.forced(2):
            ours = model(input_ids=ids).logits
        theirs = fam.peft(2).to(dtype)(input_ids=ids).logits
        routed = model(input_ids=ids).logits  # gates (float32) on converted hidden states
    assert ours.dtype == dtype and torch.isfinite(routed).all()
    assert (ours.float() - theirs.float()).abs().max().item() <= tol
