"""Dev experiment for issue #31 item 4: does depth added *to the imitated weights* bring `micro`
close to its teacher?

Earlier measurements (README, *Why, measured*) found that what imitation left in the weights, more
than the shape, is what record selection builds on (the shipped weights learn the retrieval drill
far faster than the same shape from scratch), and that twice the depth trained from scratch learnt
it slower. This arm keeps the imitated weights and adds depth on top of them (block expansion, as
LLaMA Pro does it): after each of the shipped model's layers a copy of that layer is inserted whose
output projections (attention `o_proj`, MLP `down_proj`) are zero, so the new layer adds nothing to
the residual stream and the expanded model computes exactly what the shipped one does (checked on
a held-out conversation before training: `max_logit_diff`). Then the same fine-tune as the
control arm of `micro_dagger.py` (`--recovery 0`: the warm start's own 2,000 teacher episodes,
`--steps` steps of 8 at `--lr`, every weight trained), optionally with `--context-drills N`
record-selection drills inside teacher conversations, and the same measurement on the first 100
dev tasks (guidance probe and its criterion verdict; 400 unguided episodes at T = 1).

The test split is never played. Stages resume from `--out` (a rerun repeats nothing done).

    python scripts/experiments/micro_depth_expand.py --out depth-run --json docs/micro-depth-<date>.json
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from micro_dagger import _log, measure, save_record, train
from record_code import REPO, code_state

ZEROED = ("self_attn.o_proj", "mlp.down_proj")
DEFAULT_MODEL = REPO / "trace_common/agents/shipped/micro"


def expand_depth(model: Any) -> Any:
    """Interleave a zero-output copy after every decoder layer of a Qwen3 causal LM (in place;
    returns it). Semantics, per original layer L with residual stream h:
        h = L(h);  h = L'(h)   where L' = L with o_proj = down_proj = 0, so L'(h) == h
    so the expanded model's logits equal the original's until training moves L'."""
    import torch

    layers = model.model.layers
    expanded = torch.nn.ModuleList()
    for layer in layers:
        expanded.append(layer)
        twin = copy.deepcopy(layer)
        for name in ZEROED:
            twin.get_submodule(name).weight.data.zero_()
        expanded.append(twin)
    for i, layer in enumerate(expanded):
        layer.self_attn.layer_idx = i  # the KV cache is indexed by layer
    model.model.layers = expanded
    model.config.num_hidden_layers = len(expanded)
    if getattr(model.config, "layer_types", None) is not None:
        model.config.layer_types = [t for t in model.config.layer_types for _ in (0, 1)]  # each layer's twin
    return model


def expanded_model(source: Path, out: Path) -> dict[str, Any]:
    """Write the depth-expanded `source` to `out/expanded` (a normal HF model dir); returns its
    record: the largest logit difference from `source` on a held-out teacher conversation, and
    whether 64 greedy tokens generated from its first half with the KV cache are `source`'s (the
    cache path the forward pass alone does not exercise)."""
    import torch
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    from trace_common.agents.data import expert_trajectories, held_out_data
    from trace_common.agents.micro import MicroConfig
    from trace_common.agents.sft import build_examples

    target, meta = out / "expanded", out / "expanded.json"
    if meta.is_file() and target.is_dir():
        done = json.loads(meta.read_text())
        if done.get("source") not in (None, _name(source)):
            raise SystemExit(f"{out} holds an expansion of {done['source']}, not {_name(source)}: give another --out")
        return done
    tokenizer = AutoTokenizer.from_pretrained(source)
    base = Qwen3ForCausalLM.from_pretrained(source, torch_dtype=torch.float32).eval()
    wide = expand_depth(copy.deepcopy(base))
    data = MicroConfig().data
    example = build_examples(tokenizer, expert_trajectories(held_out_data(data, 2)))[0]
    ids = torch.tensor([example.input_ids])
    with torch.no_grad():
        diff = (base(ids).logits - wide(ids).logits).abs().max().item()
        prompt = ids[:, : ids.shape[1] // 2]
        greedy = {"max_new_tokens": 64, "min_new_tokens": 64, "do_sample": False}
        same = torch.equal(base.generate(prompt, **greedy), wide.generate(prompt, **greedy))
    if diff > 1e-4 or not same:
        raise SystemExit(f"the expanded model differs from {source} (largest logit difference {diff:g}, greedy "
                         f"generations {'equal' if same else 'differ'}); expected identity")
    tmp = out / "expanded.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp, ignore=shutil.ignore_patterns("model.safetensors", "build_record.json"))
    wide.save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.replace(target)
    record = {"source": _name(source), "layers": {"before": len(base.model.layers), "after": len(wide.model.layers)},
              "parameters": {"before": sum(p.numel() for p in base.parameters()),
                             "after": sum(p.numel() for p in wide.parameters())},
              "max_logit_diff": diff, "check_tokens": len(example.input_ids), "greedy_generations_equal": same,
              "generated_tokens": greedy["max_new_tokens"]}
    meta.write_text(json.dumps(record, indent=1))
    _log(f"expanded {record['layers']['before']} -> {record['layers']['after']} layers "
         f"({record['parameters']['after']:,} parameters); max logit difference {diff:.2e}")
    return record


def _name(model: Path) -> str:
    """`model` as a record names it: relative to the repository, else its directory name (no machine paths)."""
    path = model.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--out", type=Path, required=True, help="work directory (reruns resume from it)")
    ap.add_argument("--context-drills", type=int, default=0,
                    help="record-selection drills inside teacher conversations to add (`context_drills`)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--json", type=Path, help="write the record here too")
    ap.add_argument("--note", help="a line for the record (what else it should say)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not (args.out / "expanded.json").is_file() and any((args.out / f).exists() for f in ("train.json", "measure.json")):
        raise SystemExit(f"{args.out} holds another experiment's training or measurement: give another --out")
    expansion = expanded_model(args.model, args.out)
    trained = train(args.out / "expanded", [], args.out, args.steps, args.lr, 0, args.context_drills)
    result = measure(args.out / "model", args.out)
    command = ["python", "scripts/experiments/micro_depth_expand.py", "--steps", str(args.steps), "--lr", f"{args.lr:g}"]
    command += ["--context-drills", str(args.context_drills)] if args.context_drills else []
    command += [] if args.model == DEFAULT_MODEL else ["--model", _name(args.model)]
    record = {**code_state(), "command": " ".join(command), "start_model": _name(args.model), "expansion": expansion, "train": trained, "dev": result,
              **({"note": args.note} if args.note else {})}
    save_record(record, args.out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
