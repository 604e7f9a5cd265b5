"""Design measurement for issue #31 item 4: what a larger `micro` costs to build and to play, on CPU.

For the shipped architecture and candidate larger ones (randomly initialised Qwen3 models of micro's
shape: head_dim 64, tied embeddings, a 1,154-token vocabulary like the builds' tokenizers' 1,154-1,155), on 2 torch threads:
- one imitation step: forward + backward + AdamW on a batch of 8 rows of 1,836 tokens (the builds'
  mean example length, 1,836-1,839), median of the last 3 of 4 steps;
- greedy decoding: 32 rows x 64 new tokens after a 1,500-token prompt (an evaluation turn late in a
  compound conversation), one run.
Ratios to the shipped shape are what the choice used (absolute times move with the machine's load).
Two runs on 2026-12-06 (a quiet 2-core machine; the second's record is
docs/micro-size-cost-2026-12-06.json), step / decoding seconds: shipped (1.0 M parameters) 1.72 / 3.16
and 1.82 / 3.05; 8 layers of 128 (1.9 M) 3.32 / 6.22 and 3.73 / 6.41; width 256, MLP 768 (3.4 M)
3.84 / 5.92 and 4.31 / 5.42; 6 layers of 192 (3.1 M) 4.48 / 8.64 and 4.07 / 6.58. Width 256 was chosen (most parameters per second of decoding).

    python scripts/experiments/micro_size_cost.py --json /tmp/size-cost.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

#: (name, hidden, layers, MLP width, key/value heads)
SHAPES = [("shipped", 128, 4, 384, 2), ("deeper: 8 layers", 128, 8, 384, 2), ("wider: 256", 256, 4, 768, 2),
          ("6 layers of 192", 192, 6, 576, 3)]


def measure(hidden: int, layers: int, mlp: int, kv: int) -> dict[str, float]:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=1154, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, num_key_value_heads=kv, head_dim=64,
                      max_position_embeddings=4096, tie_word_embeddings=True, pad_token_id=0, eos_token_id=1,
                      bos_token_id=None)
    model = Qwen3ForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rows = torch.randint(2, 1154, (8, 1836))
    steps = []
    for _ in range(4):
        started = time.perf_counter()
        model(input_ids=rows, labels=rows).loss.backward()
        opt.step()
        opt.zero_grad()
        steps.append(time.perf_counter() - started)
    model.eval()
    prompt = torch.randint(2, 1154, (32, 1500))
    with torch.no_grad():
        started = time.perf_counter()
        model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=64,
                       min_new_tokens=64, do_sample=False)
        decode = time.perf_counter() - started
    return {"params": sum(p.numel() for p in model.parameters()), "train_step_s": round(sorted(steps[1:])[1], 2),
            "decode_s": round(decode, 2)}


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args()
    torch.set_num_threads(2)
    result = {name: measure(h, n, m, kv) for name, h, n, m, kv in SHAPES}
    base = result["shipped"]
    for row in result.values():
        row["train_ratio"] = round(row["train_step_s"] / base["train_step_s"], 2)
        row["decode_ratio"] = round(row["decode_s"] / base["decode_s"], 2)
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
