"""The built-in precondition skill experiment: GRPO on precondition_verification from the
warm-started `micro` agent, then the held-out pass rate of the store domain, per task type.

The micro agent imitates a scripted expert that checks an order's status before cancelling
in only 25 % of its episodes (a planted, partial gap): on the store's precondition_check tasks
it fails whenever it cancels a non-pending order blind. GRPO trains one LoRA adapter on a
capability environment -- `library` (default): the environment library's
precondition_verification family for the store target (partial credit 0.4 for the lookup,
0.6 for the right outcome); `store`: the store itself restricted to precondition_check
(binary reward) -- and the adapter is evaluated on the store's test split (50 tasks per task
type, sampled at temperature 1 with fixed seeds, the rollout setting), before and after, to
see the target type improve and the other types not collapse.

    .venv/bin/python -m bench.grpo_precondition --steps 60      # writes the grpo_precondition section
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path


def env_factory(kind: str):
    if kind == "store":
        from trace_common.domains.store.env import StoreEnv

        return lambda: StoreEnv(task_types="precondition_check")
    from services.environment import library
    from services.environment.targets import resolve_target

    target = resolve_target("store").library_params(library.roles("precondition_verification"))
    return lambda: library.make_env("precondition_verification", target)


def evaluate(policy, factory, seeds, temperature: float, max_turns: int, max_tokens: int):
    from services.trainer.grpo.evaluation import evaluate_async
    from trace_common.policy.base import SamplingParams

    params = SamplingParams(temperature=temperature, max_tokens=max_tokens) if temperature > 0 else \
        SamplingParams(temperature=0.0, max_tokens=max_tokens)
    return asyncio.run(evaluate_async(policy, factory, seeds, params=params, max_turns=max_turns))


def store_eval(policy, args) -> dict:
    from trace_common.domains.store.env import SPLITS, StoreEnv

    seeds = list(SPLITS["test"])[: args.eval_tasks]
    res = evaluate(policy, StoreEnv, seeds, args.eval_temperature, args.max_turns, args.max_completion)
    return {"pass_rate": res.pass_rate, "reward_mean": res.reward_mean,
            "by_type": {k: {"n": n, "pass_rate": p} for k, (n, p) in res.by_type.items()}}


def cap_eval(policy, factory, args) -> dict:
    env = factory()
    split = env.splits().get("test") or env.splits().get("dev") or next(iter(env.splits().values()))
    seeds = list(split)[: args.cap_eval_tasks]
    res = evaluate(policy, factory, seeds, args.eval_temperature, args.max_turns, args.max_completion)
    return {"pass_rate": res.pass_rate, "reward_mean": res.reward_mean}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="micro", help="base agent name or model directory (default: micro)")
    p.add_argument("--env", choices=["library", "store"], default="library")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--beta", type=float, default=0.0)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-turns", type=int, default=10)
    p.add_argument("--max-completion", type=int, default=96)
    p.add_argument("--eval-tasks", type=int, default=200, help="store test tasks (50 per type at 200)")
    p.add_argument("--cap-eval-tasks", type=int, default=100)
    p.add_argument("--eval-temperature", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="", help="directory for checkpoints/adapter (default: a temp dir)")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from services.trainer.grpo.config import GRPOConfig
    from services.trainer.grpo.session import make_trainer
    from trace_common.agents import resolve_base_agent
    from trace_common.artifacts import open_store
    from trace_common.policy.transformers_backend import TransformersPolicy

    torch.set_num_threads(args.threads)
    base_dir = resolve_base_agent(args.model)
    from trace_common.agents import read_meta

    meta = read_meta(base_dir) or {}
    tok = AutoTokenizer.from_pretrained(base_dir)
    factory = env_factory(args.env)
    t0 = time.perf_counter()
    base_policy = TransformersPolicy.from_dir(base_dir, max_wait_s=0.0)
    before = store_eval(base_policy, args)
    cap_before = cap_eval(base_policy, factory, args)
    print("before", json.dumps(before), json.dumps(cap_before), flush=True)
    eval_s = time.perf_counter() - t0

    out = Path(args.out or tempfile.mkdtemp(prefix="grpo-precondition-"))
    store = open_store(out.resolve().as_uri())
    cfg = GRPOConfig(max_steps=args.steps, groups_per_batch=args.groups, num_generations=args.G,
                     max_completion_length=args.max_completion, max_turns=args.max_turns,
                     temperature=args.temperature, learning_rate=args.lr, lora_r=args.rank,
                     lora_alpha=2 * args.rank, beta=args.beta, save_steps=20, guidance_fraction=0.0, seed=0,
                     early_stop_uninformative_iterations=10)
    rows: list[dict] = []

    def on_event(kind, payload):
        if kind == "iteration":
            v = payload["values"]
            rows.append(v)
            print(f"it {payload['iteration']:3d} reward {v['reward_mean']:.3f} pass {v['pass_rate']:.2f} "
                  f"informative {v['informative_group_fraction']:.2f} {v['step_seconds']:.1f}s", flush=True)

    model = AutoModelForCausalLM.from_pretrained(base_dir)
    trainer = make_trainer(cfg, model, tok, factory, store=store, prefix="runs/exp/adapters/precondition_verification",
                           capability="precondition_verification", on_event=on_event, model_label=args.model)
    t1 = time.perf_counter()
    result = trainer.train(resume=False)
    train_s = time.perf_counter() - t1
    trained = TransformersPolicy.from_model(trainer.model, tok, max_wait_s=0.0)
    after = store_eval(trained, args)
    cap_after = cap_eval(trained, factory, args)
    print("after", json.dumps(after), json.dumps(cap_after), flush=True)

    types = sorted(before["by_type"])
    agent = Path(args.model).name if "/" in args.model else args.model
    lines = [f"## GRPO precondition skill experiment ({agent} agent, CPU)", "",
             f"- command: `{shlex.join(['.venv/bin/python', '-m', 'bench.grpo_precondition', *sys.argv[1:]])}`",
             f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
             f"- base: `{args.model}` ({base_dir.name}, {meta.get('metrics', {}).get('parameters', '?')} parameters); "
             f"capability env: {args.env}; GRPO {result.iterations} iterations "
             f"({result.stop_reason}) x {args.groups} groups x {args.G} episodes, LoRA r={args.rank}, lr {args.lr:g}, "
             f"beta {args.beta:g}, temperature {args.temperature:g}; training {train_s / 60:.1f} min "
             f"({train_s / max(1, result.iterations):.1f} s/iteration); one evaluation pass {eval_s / 60:.1f} min",
             f"- held-out: store test split, first {args.eval_tasks} tasks, one episode each, sampled at temperature "
             f"{args.eval_temperature:g} with fixed seeds (same seeds before and after)",
             f"- adapter: {result.adapter_uri}",
             "",
             "| task type | n | pass rate before | pass rate after |",
             "|---|---:|---:|---:|"]
    for t in types:
        b, a = before["by_type"][t], after["by_type"].get(t, {"pass_rate": float("nan")})
        lines.append(f"| {t} | {b['n']} | {b['pass_rate']:.2f} | {a['pass_rate']:.2f} |")
    lines.append(f"| all | {args.eval_tasks} | {before['pass_rate']:.3f} | {after['pass_rate']:.3f} |")
    lines += ["", f"- capability env held-out ({args.cap_eval_tasks} tasks): reward {cap_before['reward_mean']:.3f} -> "
              f"{cap_after['reward_mean']:.3f}, pass rate {cap_before['pass_rate']:.2f} -> {cap_after['pass_rate']:.2f}",
              "- training curve (reward mean per iteration): "
              + ", ".join(f"{r['reward_mean']:.2f}" for r in rows)]
    body = "\n".join(lines) + "\n"
    print(body)
    (out / "experiment.json").write_text(json.dumps({"before": before, "after": after, "cap_before": cap_before,
                                                     "cap_after": cap_after, "history": rows}, indent=1))
    if not args.no_write:
        from bench.harness import write_section

        # one section per base agent: `micro` keeps the original name
        write_section("grpo_precondition" if agent == "micro" else f"grpo_precondition_{agent}", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
