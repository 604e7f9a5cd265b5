"""Guided rollouts: which treatment of the off-policy (guided) episodes learns a rare behaviour?

Setup (CPU, seeded): `ToolEnv` (tests/unit/trainer/grpo/helpers.py) -- the user asks for a secret
number; looking it up with the `lookup` tool earns 0.5, telling the looked-up number earns 1.
The tiny model is warm-started on demonstrations in which the agent looks up only with
probability `--p-lookup` -- but always when the prompt carries the hint "Hint: call lookup
first." (30 % of demonstrations) -- so the hint steers it and the unguided behaviour is rare.
GRPO then trains with the hint in `--fraction` of each group's episodes, with the guided
tokens either importance-weighted (min(C, pi(y|unguided) / q(y|guided))) or excluded from the
loss, against a baseline without guidance. Measured: the unguided policy's mean reward and
lookup rate on held-out seeds (sampled at temperature 1), before and after, and the
informative-group fraction during training.

    .venv/bin/python -m bench.grpo_guidance          # writes the grpo_guidance section of bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import sys
import time

MODES = {"no guidance": dict(guidance_fraction=0.0),
         "guided, importance-weighted": dict(guidance_fraction=0.25, guidance_mode="importance_weighted"),
         "guided, excluded from loss": dict(guidance_fraction=0.25, guidance_mode="exclude")}


def held_out(model, tok, n: int) -> tuple[float, float]:
    from services.trainer.grpo.rollouts import EpisodeSpec, play_groups
    from tests.unit.trainer.grpo.helpers import ToolEnv
    from trace_common.policy.base import SamplingParams
    from trace_common.policy.transformers_backend import TransformersPolicy

    policy = TransformersPolicy.from_model(model, tok, max_wait_s=0.0)
    specs = [EpisodeSpec(seed=500 + i % 50, group=i, index=0, guided=False, sampling_seed=77 + i) for i in range(n)]

    async def go():
        try:
            return await play_groups(policy, ToolEnv, specs, params=SamplingParams(max_tokens=32), max_turns=3)
        finally:
            await policy.close()
    trajs = asyncio.run(go())
    return statistics.mean(t.reward for t in trajs), statistics.mean(t.reward >= 0.5 for t in trajs)


def run(mode: str, seed: int, args) -> dict:
    import torch

    from services.trainer.grpo.config import GRPOConfig
    from services.trainer.grpo.session import make_trainer
    from tests.unit.trainer.grpo.helpers import ToolEnv, tiny_tokenizer, warm_model

    torch.manual_seed(seed)
    tok = tiny_tokenizer()
    model = warm_model("tool", args.p_lookup)
    before = held_out(model, tok, args.eval_episodes)
    extra = dict(MODES[mode])
    if extra.get("guidance_fraction"):
        extra["guidance_fraction"] = args.fraction
    cfg = GRPOConfig(max_steps=args.steps, groups_per_batch=4, num_generations=8, max_completion_length=32,
                     max_turns=3, learning_rate=args.lr, lora_r=8, save_steps=0, seed=seed,
                     early_stop_uninformative_iterations=0, **extra)
    rows = []
    trainer = make_trainer(cfg, model, tok, ToolEnv,
                           on_event=lambda k, p: rows.append(p["values"]) if k == "iteration" else None)
    t0 = time.perf_counter()
    trainer.train(resume=False, write_adapter=False)
    after = held_out(trainer.model, tok, args.eval_episodes)
    return {"before": before, "after": after, "seconds": time.perf_counter() - t0,
            "informative": statistics.mean(r["informative_group_fraction"] for r in rows),
            "is_weight": statistics.mean([r["importance_weight_mean"] for r in rows if "importance_weight_mean" in r]
                                         or [float("nan")])}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--p-lookup", type=float, default=0.05)
    p.add_argument("--fraction", type=float, default=0.25)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--eval-episodes", type=int, default=128)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    results: dict[str, list[dict]] = {m: [] for m in MODES}
    for seed in range(args.seeds):
        for mode in MODES:
            r = run(mode, seed, args)
            results[mode].append(r)
            print(mode, seed, r, flush=True)
    lines = [f"## Guided rollouts: importance-weighted vs excluded (toy tool env, unguided lookup demos "
             f"{args.p_lookup:.0%})", "",
             f"- command: `{shlex.join(['.venv/bin/python', '-m', 'bench.grpo_guidance', *sys.argv[1:]])}`",
             f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
             f"- setup: warm-started tiny Qwen3 looks the number up in {args.p_lookup:.0%} of unguided "
             f"demonstrations (always when hinted); GRPO {args.steps} iterations x 4 groups x 8 episodes, "
             f"hint in {args.fraction:.0%} of each group's episodes, LoRA r=8, lr {args.lr:g}; held-out: "
             f"{args.eval_episodes} unguided episodes sampled at temperature 1; {args.seeds} seeds (mean)",
             "",
             "| treatment | unguided reward before | after | lookup rate before | after | informative groups | "
             "mean IS weight |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for mode, rs in results.items():
        def m(f, rs=rs):
            return statistics.mean(f(r) for r in rs)
        lines.append(f"| {mode} | {m(lambda r: r['before'][0]):.3f} | {m(lambda r: r['after'][0]):.3f} | "
                     f"{m(lambda r: r['before'][1]):.2f} | {m(lambda r: r['after'][1]):.2f} | "
                     f"{m(lambda r: r['informative']):.2f} | {m(lambda r: r['is_weight']):.2f} |")
    body = "\n".join(lines) + "\n"
    print(body)
    if not args.no_write:
        from bench.harness import write_section

        write_section(f"grpo_guidance_p{args.p_lookup:g}", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
