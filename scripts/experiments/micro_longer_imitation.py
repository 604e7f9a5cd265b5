"""Dev experiment for issue #31 item 4: does longer imitation on more teacher data bring the shipped
`micro` closer to its teacher?

Design (fixed before the run; dev split only, test untouched):
- start: the shipped `micro` (trace_common/agents/shipped/micro), its tokenizer kept;
- data: fresh train seeds [2000, 2000 + episodes) of the same teacher as the build (every skill 0.5,
  a quarter guided, expert_seed 0) -- the build trained on seeds [0, 2000);
- training: `steps` imitation steps (sft.train: batch 8, peak learning rate `lr`, 5 % warm-up, cosine
  to 0.1, no copying phase, sft seed 1);
- measures: teacher-forced accuracy on the 32 train episodes after the new data, before and after;
  the build's guidance probe (first 100 dev tasks, greedy, unguided and guided, and the teacher with 4
  skill draws per task); and, for the shipped and the continued model, 4 sampled episodes (T = 1,
  seeds 0-3) of each of those 100 dev tasks unguided, to tell a decoding artefact from a skill gap.

No checkpoints: about an hour on one core of a 2-core machine; rerun from the start if stopped.
README ("What #31 changed, measured on dev") has the numbers of the run on 2026-12-04, and
docs/micro-longer-imitation-2026-12-04.json its record.

    python scripts/experiments/micro_longer_imitation.py --out /tmp/micro-longer
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "trace_common" / "agents" / "shipped" / "micro"


def continue_imitation(out: Path, episodes: int, steps: int, lr: float) -> dict:
    import torch
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    from trace_common.agents.data import expert_trajectories
    from trace_common.agents.micro import _every_skill_half
    from trace_common.agents.sft import SFTConfig, build_examples, teacher_forced_accuracy, train

    base = _every_skill_half()
    tok = AutoTokenizer.from_pretrained(SHIPPED)
    examples = build_examples(tok, expert_trajectories(base.model_copy(update={"first_seed": 2000,
                                                                               "episodes": episodes})))
    held = build_examples(tok, expert_trajectories(base.model_copy(update={"first_seed": 2000 + episodes,
                                                                           "episodes": 32})))
    model = Qwen3ForCausalLM.from_pretrained(SHIPPED, torch_dtype=torch.float32)
    before = teacher_forced_accuracy(model, held, tok.pad_token_id)
    cfg = SFTConfig(steps=steps, batch_size=8, learning_rate=lr, warmup_ratio=0.05, min_lr_ratio=0.1,
                    weight_decay=0.01, max_grad_norm=1.0, max_seq_len=3072, seed=1, copy_steps=0)
    result = train(model, examples, cfg, tok.pad_token_id, log=lambda s: print(s, flush=True), log_every=50)
    after = teacher_forced_accuracy(model, held, tok.pad_token_id)
    model.generation_config = Qwen3ForCausalLM.from_pretrained(SHIPPED).generation_config
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return {"episodes": episodes, "steps": steps, "lr": lr, "held_out_before": before, "held_out_after": after,
            "final_loss": result.final_loss, "sft_seconds": result.seconds}


def sampled_probe(model_dir: Path, seeds: int = 4, tasks: int = 100) -> dict:
    """Unguided, T = 1, `seeds` sampled episodes of each of the first `tasks` dev tasks."""
    from trace_common.agents.guided_probe import agent_probe

    runs = [asyncio.run(agent_probe(model_dir, guided=False, split="dev", episodes=tasks, temperature=1.0, seed=s))
            for s in range(seeds)]
    sub: dict[str, list[int]] = {}
    for r in runs:
        for k, v in r["subgoal_success"].items():
            a = sub.setdefault(k, [0, 0])
            a[0] += v["met"]
            a[1] += v["total"]
    return {"passed": sum(r["passed"] for r in runs), "episodes": seeds * tasks,
            "subgoal": {k: [m, t, round(m / t, 3)] for k, (m, t) in sorted(sub.items())}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where the continued model and results go")
    parser.add_argument("--episodes", type=int, default=4000)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()
    from trace_common.agents.guided_probe import probe_model_dir
    from trace_common.agents.micro import _every_skill_half

    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    record = continue_imitation(args.out, args.episodes, args.steps, args.lr)
    record["probe"] = probe_model_dir(args.out, _every_skill_half(), split="dev", episodes=100, temperatures=(0.0,))
    record["sampled"] = {"shipped": sampled_probe(SHIPPED), "continued": sampled_probe(args.out)}
    record["seconds"] = round(time.perf_counter() - started, 1)
    (args.out / "experiment.json").write_text(json.dumps(record, indent=1))
    print(json.dumps({k: record[k] for k in ("held_out_before", "held_out_after", "sampled")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
