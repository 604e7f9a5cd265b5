"""Dev measurement for issue #31 item 4: does a record-selection drill learnt on its own carry to
the same choice inside a conversation?

After fine-tunes with `retrieval_drills` (a by-attributes request and the order listing, answered
by the right order and item ids) held-out drill exactness rose from 0 to 0.215 and 0.425, yet the
agent's greedy record selection stayed at 0.45. This scores each given model, teacher-forced
(greedy = all-argmax), on two held-out sets of the same choice, fixed before the run:
- `drills`: `micro_dagger.retrieval_drills`' 200 held-out drills (train seeds from 20,000);
- `in_conversation`: `micro_dagger.context_drills`' held-out ones (train seeds from 40,000): the
  skilled teacher's conversation up to its call naming the designated order, scored on that call;
- each again scored on the order id's tokens alone (`*_order_id`: the choice of record, apart from
  the item id and, in the conversation, the rest of the call).
Nothing is trained; dev and test are never played.

    python scripts/experiments/micro_drill_transfer.py --model shipped=trace_common/agents/shipped/micro \\
        --model control=<dir> ... --json docs/micro-drill-transfer-<date>.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from micro_dagger import context_drills, retrieval_drills
from record_code import code_state


def score(model_dir: Path, sets: dict[str, list[Any]]) -> dict[str, Any]:
    import torch
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    from trace_common.agents.sft import teacher_forced_accuracy

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = Qwen3ForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    with torch.no_grad():
        return {name: {k: round(v, 4) for k, v in teacher_forced_accuracy(model, examples,
                                                                          tokenizer.pad_token_id).items()}
                for name, examples in sets.items()}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", required=True, metavar="LABEL=DIR",
                    help="a model to score (repeat); every model must share the first one's tokenizer")
    ap.add_argument("--json", type=Path, help="write the record here")
    args = ap.parse_args(argv)
    models = []
    for item in args.model:
        label, sep, path = item.partition("=")
        if not sep or not label or not Path(path, "config.json").is_file():
            ap.error(f"--model {item!r}: expected LABEL=DIR, DIR a saved model (with config.json)")
        models.append((label, Path(path)))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(models[0][1])
    sets = {"drills": retrieval_drills(tokenizer, 0)[1], "in_conversation": context_drills(tokenizer, 0)[1],
            "drills_order_id": retrieval_drills(tokenizer, 0, "order_id")[1],
            "in_conversation_order_id": context_drills(tokenizer, 0, "order_id")[1]}
    rows = {}
    for label, path in models:
        if AutoTokenizer.from_pretrained(path).get_vocab() != tokenizer.get_vocab():
            raise SystemExit(f"--model {label}: another tokenizer than {models[0][0]}'s; score it in its own run")
        t0 = time.perf_counter()
        rows[label] = {**score(path, sets), "seconds": round(time.perf_counter() - t0, 1)}
        print(f"[{time.strftime('%H:%M:%S')}] {label}: " + ", ".join(
            f"{k} exact {v['turn_exact']:.3f}" for k, v in rows[label].items() if isinstance(v, dict)), flush=True)
    record = {**code_state(), "held_out": {k: len(v) for k, v in sets.items()},
              "models": {label: str(path) for label, path in models}, "scores": rows}
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
