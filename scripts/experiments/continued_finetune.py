"""A resumable continuation of a built agent's fine-tune on fresh teacher episodes (issue #31 item 4).

`pretrained_base_fidelity.py --continue-steps N` uses it: the SmolLM2 recipe's 50 steps saw about 200
teacher episodes, and that build missed the close-to-teacher criterion (README *Why, measured*). This
trains the built model N more steps on episodes it never saw, so "does a longer fine-tune close the
gap?" costs N steps rather than a rebuild. What is fixed here, before a run:

- data: `MicroConfig().data` (every skill 0.5, a quarter guided: the build's teacher) on `episodes`
  train seeds starting at `FIRST_SEED`, after the build's 400 and its 8 held-out episodes (400-407), so
  no episode repeats one the build trained on or is held out on; episodes over 2,048 tokens skipped;
- optimisation: the recipe's own (`SmolLM2Config().sft`: batch 4, AdamW at 1e-4, 10 % warmup, cosine
  to 1e-5, weight decay 0.01, clipping at 1.0) over the N steps, batches from `sft`'s length-bucketed
  batcher; matmuls under bfloat16 autocast with float32 weights (on this machine's AVX512-BF16 cores a
  step costs 0.57 of a float32 one: 28 s against 47-52 s for 4 episodes, the same loss to 1e-3);
- afterwards: the held-out teacher-forced accuracy on the build's 8 held-out episodes (seeds 400-407)
  and the model saved in float32, probed as the build was.

Why our own loop instead of `sft.train`: the continuation is checkpointed (model, optimizer, scheduler,
losses) every `CHECKPOINT_EVERY` steps and resumes from the last checkpoint, because a run of N steps
outlasts a session on a 2-core machine; `sft.train` is build code (changing it changes the shipped
`micro`'s cache key) and has no checkpoints. The per-step maths is `sft.batch_loss` itself.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

FIRST_SEED = 408          # after the build's 400 training and 8 held-out seeds
CHECKPOINT_EVERY = 10


def continue_dir(model_dir: Path, out: Path, steps: int) -> Path:
    return out / f"{model_dir.name}-plus{steps}"


def continue_finetune(model_dir: Path, out: Path, steps: int, episodes: int, *,
                      log: Any = print) -> tuple[Path, dict[str, Any]]:
    """The model of `model_dir` fine-tuned `steps` more steps; resumes from `out`'s checkpoint."""
    import random

    import torch
    from transformers import AutoTokenizer

    from trace_common.agents.data import expert_trajectories, held_out_data
    from trace_common.agents.micro import MicroConfig
    from trace_common.agents.sft import (
        _batches,
        _lr_lambda,
        batch_loss,
        build_examples,
        teacher_forced_accuracy,
    )
    from trace_common.agents.smollm2 import SmolLM2Config
    from trace_common.hf_load import load_causal_lm
    from trace_common.policy.chat import TRACE_CHATML_TEMPLATE

    final = continue_dir(model_dir, out, steps)
    if (final / "continued.json").is_file():
        meta = json.loads((final / "continued.json").read_text())
        if (meta["episodes"], meta["first_seed"]) != (episodes, FIRST_SEED):
            raise SystemExit(f"{final} was continued on {meta['episodes']} episodes from seed {meta['first_seed']}, "
                             f"not {episodes} from {FIRST_SEED}: use another --out, or the same settings")
        return final, meta
    cfg = SmolLM2Config().sft.model_copy(update={"steps": steps})
    data = MicroConfig().data.model_copy(update={"first_seed": FIRST_SEED, "episodes": episodes})
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = TRACE_CHATML_TEMPLATE
    examples = build_examples(tokenizer, expert_trajectories(data))
    kept = [e for e in examples if len(e.input_ids) <= cfg.max_seq_len]
    if len(kept) < steps * cfg.batch_size:
        log(f"note: {len(kept)} episodes for {steps * cfg.batch_size} sequences: some are seen twice")
    model = load_causal_lm(model_dir)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=cfg.learning_rate, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(cfg))
    ckpt = out / f"{final.name}.ckpt"
    done, losses, seconds = 0, [], 0.0
    if ckpt.is_file():
        state = torch.load(ckpt, weights_only=False)
        if state.get("episodes", episodes) != episodes:
            raise SystemExit(f"{ckpt} continues a run on {state['episodes']} episodes, not {episodes}: use "
                             "another --out, or the same --continue-episodes")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        done, losses, seconds = state["step"], state["losses"], state["seconds"]
        log(f"resumed at step {done} of {steps}")
    batches = _batches(kept, cfg.batch_size, random.Random(f"sft:{cfg.seed}"))
    for _ in range(done):       # the same data order as an uninterrupted run
        next(batches)
    torch.set_num_threads(os.cpu_count() or 1)
    model.train()
    started = time.perf_counter()
    for step in range(done, steps):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, n_tok, _ = batch_loss(model, next(batches), tokenizer.pad_token_id)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(round(loss.item(), 4))
        if (step + 1) % CHECKPOINT_EVERY == 0 or step + 1 == steps:
            spent = seconds + time.perf_counter() - started
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                        "step": step + 1, "losses": losses, "seconds": spent,
                        "episodes": episodes}, ckpt.with_suffix(".tmp"))
            os.replace(ckpt.with_suffix(".tmp"), ckpt)
            window = losses[-CHECKPOINT_EVERY:]
            log(f"step {step + 1}/{steps}: loss {sum(window) / len(window):.4f}, lr {sched.get_last_lr()[0]:.2e}, "
                f"{spent:.0f} s of training (checkpointed)")
    seconds += time.perf_counter() - started
    model.eval()
    held_out = build_examples(tokenizer, expert_trajectories(held_out_data(MicroConfig().data.model_copy(
        update={"episodes": 400}), episodes=8)))
    accuracy = teacher_forced_accuracy(model, held_out, tokenizer.pad_token_id, batch_size=2)
    tmp = final.with_name(final.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    meta = {"from": model_dir.name, "steps": steps, "episodes": episodes, "first_seed": FIRST_SEED,
            "examples_kept": len(kept), "skipped_long": len(examples) - len(kept),
            "sequences_trained": steps * cfg.batch_size, "sft": cfg.model_dump(mode="json"),
            "autocast": "bfloat16 (float32 weights)", "train_seconds": round(seconds, 1),
            "held_out_token_accuracy": round(accuracy["token_accuracy"], 4),
            "held_out_turn_exact": round(accuracy["turn_exact"], 4), "loss_curve": losses}
    (tmp / "continued.json").write_text(json.dumps(meta, indent=1))
    os.replace(tmp, final)
    ckpt.unlink(missing_ok=True)
    log(f"continued {steps} steps in {seconds:.0f} s; held-out turn exact {meta['held_out_turn_exact']}")
    return final, meta
