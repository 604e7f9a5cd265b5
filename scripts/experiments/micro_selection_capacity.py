"""Dev experiment for issue #31 item 4: can a model of `micro`'s shape learn record selection at all?

Where `micro` first departs from its teacher it is mostly a wrong id: it does not find the
record a request describes by its attributes (docs/micro-dagger-2026-12-06.json). 300 steps of
record-selection drills on top of the shipped build lifted held-out drill exactness from 0 to
0.215 and no pass. This asks the narrower question before another two-hour build: trained on
nothing but such drills (`micro_dagger.retrieval_drills`: a by-attributes request and the user's
order listing, answered by the right order id and item id), how far does each shape get?

Arms (fixed before the run), each on the same drills in the same order, the shipped tokenizer:
- `shipped`: the shipped weights (4 layers x 128), drills only, peak lr 1e-3;
- `scratch-4x128`: the shipped shape from scratch, with the build's copying steps on the drills'
  own text first (1,600: `MicroConfig().sft.copy_steps`), peak lr 3e-3 (the build's);
- `scratch-8x128`: twice as deep, otherwise the same (the learning rate not tuned for depth).
The first record (docs/micro-selection-capacity-2026-12-06.json) gave the scratch arms 300 copying
steps, too few for the copying to form (micro.py: it forms between 800 and 1,600 steps on these
data); `--copy-steps` sets them, and each record says what it ran.
Metric: held-out drill exactness (every answer token the argmax, i.e. what greedy decoding
writes), on `DRILLS_HELD_OUT` drills of other tasks, before any step, after the copying steps and
every `--eval-every` drill steps; the copying phase's final loss shows whether copying formed. The test split
is never played; drill tasks are train seeds past the warm start's and the roll-in's.

    python scripts/experiments/micro_selection_capacity.py --steps 800 --json docs/micro-selection-capacity-<date>.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from micro_dagger import DRILLS_HELD_OUT, retrieval_drills
from record_code import code_state

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "trace_common/agents/shipped/micro"
#: name -> (layers, hidden, start from the shipped weights, peak learning rate, copies: from scratch)
ARMS: dict[str, tuple[int, int, bool, float, bool]] = {
    "shipped": (4, 128, True, 1e-3, False),
    "scratch-4x128": (4, 128, False, 3e-3, True),
    "scratch-8x128": (8, 128, False, 3e-3, True),
}


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _model(layers: int, hidden: int, shipped: bool) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    if shipped:
        return AutoModelForCausalLM.from_pretrained(SHIPPED, dtype=torch.float32)
    base = Qwen3Config.from_pretrained(SHIPPED)
    config = Qwen3Config(**{**base.to_dict(), "num_hidden_layers": layers, "hidden_size": hidden,
                            "intermediate_size": 3 * hidden, "num_attention_heads": hidden // base.head_dim,
                            "layer_types": None})
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config)


def run_arm(name: str, drills: Sequence[Any], held_out: Sequence[Any], tokenizer: Any, steps: int,
            batch_size: int, eval_every: int, build_copy_steps: int) -> dict[str, Any]:
    from trace_common.agents.sft import SFTConfig, teacher_forced_accuracy, train

    layers, hidden, shipped, lr, copies = ARMS[name]
    copy_steps = build_copy_steps if copies else 0
    model = _model(layers, hidden, shipped)
    curve: list[tuple[int, float]] = []  # (drill step, held-out exact); drill step 0 is after any copying
    exact0 = teacher_forced_accuracy(model, held_out, tokenizer.pad_token_id)["turn_exact"]
    if not copy_steps:
        curve.append((0, round(exact0, 4)))
    _log(f"{name}: {sum(p.numel() for p in model.parameters()):,} parameters; held-out exact at 0: {exact0:.3f}")

    def on_step(step: int, total: int, loss: float, phase: str) -> None:
        if step - copy_steps == 0 or (phase == "imitation" and (step - copy_steps) % eval_every == 0):
            exact = teacher_forced_accuracy(model, held_out, tokenizer.pad_token_id)["turn_exact"]
            model.train()
            curve.append((step - copy_steps, round(exact, 4)))
            _log(f"{name}: drill step {step - copy_steps}/{steps} loss {loss:.3f} held-out exact {exact:.3f}")

    cfg = SFTConfig(steps=steps, batch_size=batch_size, learning_rate=lr, copy_steps=copy_steps,
                    copy_batch_size=32, max_seq_len=3072)
    result = train(model, drills, cfg, tokenizer.pad_token_id, on_step=on_step)
    return {"layers": layers, "hidden": hidden, "from_shipped": shipped, "learning_rate": lr,
            "copy_steps": copy_steps, "parameters": sum(p.numel() for p in model.parameters()),
            "copy_final_loss": None if result.copy_final_loss is None else round(result.copy_final_loss, 4),
            "exact_before_training": round(exact0, 4), "seconds": round(result.seconds, 1), "final_loss": round(result.final_loss, 4),
            "held_out_exact": curve}


def main(argv: Sequence[str] | None = None) -> int:
    from transformers import AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--drills", type=int, default=6000, help="training drills")
    ap.add_argument("--steps", type=int, default=800, help="drill steps per arm (after any copying steps)")
    ap.add_argument("--copy-steps", type=int, default=None,
                    help="copying steps of the scratch arms (default: the build's, MicroConfig().sft.copy_steps)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--json", type=Path, help="write the record here (rewritten after each arm)")
    args = ap.parse_args(argv)
    from trace_common.agents.micro import MicroConfig

    copy_steps = MicroConfig().sft.copy_steps if args.copy_steps is None else args.copy_steps
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED)
    drills, held_out = retrieval_drills(tokenizer, args.drills)
    mean_len = sum(len(d.input_ids) for d in drills) / len(drills)
    _log(f"{len(drills)} drills (mean {mean_len:.0f} tokens), {len(held_out)} held out")
    record: dict[str, Any] = {**code_state(), "drills": len(drills),
                              "held_out": DRILLS_HELD_OUT, "mean_drill_tokens": round(mean_len, 1),
                              "steps": args.steps, "batch_size": args.batch_size, "eval_every": args.eval_every,
                              "arms": {}}
    for name in args.arms:
        record["arms"][name] = run_arm(name, drills, held_out, tokenizer, args.steps, args.batch_size,
                                       args.eval_every, copy_steps)
        if args.json:
            args.json.write_text(json.dumps(record, indent=1) + "\n")
    for name, arm in record["arms"].items():
        _log(f"{name}: held-out exact {arm['held_out_exact'][-1][1]:.3f} after {args.steps} steps, {arm['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
