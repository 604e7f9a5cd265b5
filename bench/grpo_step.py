"""One GRPO iteration: TRACE's trainer (services.trainer.grpo) against TRL's GRPOTrainer, same work.

Both sides get the same tiny Qwen3 model (built in code, seeded), the same tokenizer and chat
template, the same prompts (a shared ~100-token system prompt + a short user request), the same
reward (fraction of vowels among the completion's letters: continuous, so every group is
informative), groups x group size completions of at most `--completion` tokens, LoRA rank
`--rank` on all linear layers, beta = 0, clip-higher (0.2 / 0.28), token-mean (`dapo`) loss,
one optimizer step per iteration, true sampling (temperature 1, top_k 0, top_p 1).

Each side runs in its own process (peak memory is per process): `--warmup` iterations, then
`--reps` measured ones. Phases: generate (TRACE: rollouts; TRL: `_generate_single_turn`),
logprob (forward passes computing token logprobs; TRL: `_get_per_token_logps_and_entropies`),
backward (`loss.backward` / `accelerator.backward`), optimizer (`Optimizer.step`, global hooks
on both sides) and the whole step. Memory: the process's peak RSS over the run above its RSS
with the model built (Linux VmHWM, reset through /proc/self/clear_refs there) -- what the
trainer adds: optimizer state, generation caches, activations -- and the absolute peak. Each
side runs with and without gradient checkpointing (TRL's default is on, TRACE's off).

    .venv/bin/python -m bench.grpo_step            # writes the grpo_step section of bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SYSTEM = ("You are a helpful assistant for a small online store. Answer briefly and politely. "
          "Use plain words. Never invent order numbers, prices or dates. If you do not know, say so. "
          "Keep every answer under three sentences and do not repeat the question back to the user.")
WORDS = ("apple banana cherry garden window river mountain pencil blanket candle violin rocket tiger "
         "orange purple silver morning evening summer winter coffee bread").split()


def prompt(i: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Tell me one thing about {WORDS[i % len(WORDS)]} number {i}."}]


def vowel_reward(text: str) -> float:
    letters = [c for c in text.lower() if c.isalpha()]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0


# -- shared model --------------------------------------------------------------------------------

def build(hidden: int, layers: int):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from trace_common.agents.tokenizer import train_tokenizer
    from trace_common.policy.chat import TRACE_CHATML_TEMPLATE, render_template_text

    texts = [render_template_text(TRACE_CHATML_TEMPLATE, prompt(i) + [{"role": "assistant", "content": w}])
             for i, w in enumerate(WORDS * 3)]
    tok = train_tokenizer(texts, vocab_size=1024)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                      num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 128), head_dim=64,
                      max_position_embeddings=2048, tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
                      eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg)
    model.generation_config.eos_token_id = cfg.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


# -- measurement helpers ---------------------------------------------------------------------------

def rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def model_loaded_baseline() -> int:
    """RSS (KiB) with the model built and nothing of a trainer yet; the peak counter restarts here."""
    import gc

    gc.collect()
    reset_peak()
    return rss_kib("VmRSS")


def with_memory(rows: list[dict], base_kib: int) -> list[dict]:
    """Attach the run's peak RSS above the model-loaded baseline (trainer, optimizer state,
    generation caches, activations: everything the trainer added) and the absolute peak."""
    peak = rss_kib("VmHWM")
    return [dict(r, peak_delta_mib=(peak - base_kib) / 1024, peak_mib=peak / 1024) for r in rows]


class Phases:
    def __init__(self) -> None:
        self.cur: dict[str, float] = {}
        self._opt_t0 = 0.0

    def add(self, name: str, seconds: float) -> None:
        self.cur[name] = self.cur.get(name, 0.0) + seconds

    def wrap(self, obj, attr: str, name: str) -> None:
        fn = getattr(obj, attr)

        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.add(name, time.perf_counter() - t0)
        setattr(obj, attr, timed)

    def hook_optimizers(self) -> None:
        """Time Optimizer.step (outermost call only: accelerate wraps the torch optimizer in another)."""
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        depth = [0]

        def pre(*_):
            if depth[0] == 0:
                self._opt_t0 = time.perf_counter()
            depth[0] += 1

        def post(*_):
            depth[0] -= 1
            if depth[0] == 0:
                self.add("optimizer", time.perf_counter() - self._opt_t0)
        register_optimizer_step_pre_hook(pre)
        register_optimizer_step_post_hook(post)


# -- workers ---------------------------------------------------------------------------------------

def worker_trace(args, gradient_checkpointing: bool) -> list[dict]:
    from typing import ClassVar

    from services.trainer.grpo.config import GRPOConfig
    from services.trainer.grpo.session import make_trainer
    from trace_common.env import Environment, Message, MessageAction, Observation, StepResult

    class BenchEnv(Environment):
        name: ClassVar[str] = "bench"
        version: ClassVar[str] = "1.0.0"
        default_max_turns: ClassVar[int] = 1

        def __init__(self):
            self._seed, self._text, self._done = 0, "", False

        def splits(self):
            return {"train": range(0, 4096)}

        def tool_schemas(self):
            return []

        def reset(self, seed):
            self._seed, self._text, self._done = seed, "", False
            return Observation(messages=[Message.from_dict(m) for m in prompt(seed)], task_id=str(seed), seed=seed)

        @property
        def task_id(self):
            return str(self._seed)

        @property
        def done(self):
            return self._done

        def step(self, action):
            self._text = action.content if isinstance(action, MessageAction) else action.name
            self._done = True
            return StepResult(observation=[Message.user("ok")], done=True)

        def reward(self):
            return vowel_reward(self._text)

    model, tok = build(args.hidden, args.layers)
    cfg = GRPOConfig(max_steps=args.warmup + args.reps, groups_per_batch=args.groups, num_generations=args.G,
                     max_completion_length=args.completion, learning_rate=1e-4, lora_r=args.rank,
                     lora_alpha=2 * args.rank, save_steps=0, guidance_fraction=0.0, seed=0,
                     early_stop_uninformative_iterations=0, generation_batch_size=args.groups * args.G,
                     gradient_checkpointing=gradient_checkpointing)
    phases = Phases()
    phases.hook_optimizers()
    rows: list[dict] = []

    def on_event(kind, payload):
        if kind != "iteration":
            return
        v = payload["values"]
        row = dict(phases.cur, generate=v["generate_seconds"], logprob=v.get("logprob_seconds", 0.0),
                   backward=v.get("backward_seconds", 0.0), step=v["step_seconds"], tokens=v["generated_tokens"])
        rows.append(row)
        phases.cur = {}

    base = model_loaded_baseline()
    trainer = make_trainer(cfg, model, tok, BenchEnv, on_event=on_event)
    trainer.train(resume=False, write_adapter=False)
    return with_memory(rows[args.warmup:], base)


def worker_trl(args, gradient_checkpointing: bool) -> list[dict]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model, tok = build(args.hidden, args.layers)
    n = args.groups * args.G
    data = Dataset.from_list([{"prompt": prompt(i)} for i in range(4096)])

    def reward(completions, **_):
        return [vowel_reward(c[0]["content"] if isinstance(c, list) else c) for c in completions]

    phases = Phases()
    phases.hook_optimizers()
    rows: list[dict] = []
    state: dict = {}

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **kw):
            state["t0"] = time.perf_counter()

        def on_step_end(self, *a, **kw):
            rows.append(dict(phases.cur, step=time.perf_counter() - state["t0"]))
            phases.cur = {}

    base = model_loaded_baseline()

    with tempfile.TemporaryDirectory() as out:
        cfg = GRPOConfig(output_dir=out, per_device_train_batch_size=n, num_generations=args.G,
                         max_completion_length=args.completion, max_steps=args.warmup + args.reps,
                         learning_rate=1e-4, beta=0.0, epsilon=0.2, epsilon_high=0.28, loss_type="dapo",
                         scale_rewards="group", temperature=1.0, top_p=1.0, top_k=0, num_iterations=1,
                         gradient_accumulation_steps=1, gradient_checkpointing=gradient_checkpointing,
                         logging_steps=10_000, report_to="none", save_strategy="no", use_cpu=True, bf16=False,
                         seed=0, disable_tqdm=True, dataloader_num_workers=0)
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=data, processing_class=tok,
                              peft_config=LoraConfig(r=args.rank, lora_alpha=2 * args.rank,
                                                     target_modules="all-linear", task_type="CAUSAL_LM"),
                              callbacks=[Timer()])
        phases.wrap(trainer, "_generate_single_turn", "generate")
        phases.wrap(trainer, "_get_per_token_logps_and_entropies", "logprob")
        phases.wrap(trainer.accelerator, "backward", "backward")
        torch.manual_seed(0)
        trainer.train()
    return with_memory(rows[args.warmup:], base)


# -- driver ------------------------------------------------------------------------------------------

PHASES = ("generate", "logprob", "backward", "optimizer", "step")
#: variant -> (implementation, gradient checkpointing)
VARIANTS = {"trace": ("trace", False), "trl-nogc": ("trl", False), "trace-gc": ("trace", True), "trl": ("trl", True)}


def summarize(rows: list[dict]) -> dict:
    out = {p: statistics.median(r.get(p, 0.0) for r in rows) for p in PHASES}
    out["peak_delta_mib"] = max(r["peak_delta_mib"] for r in rows)
    out["peak_mib"] = max(r["peak_mib"] for r in rows)
    out["reps"] = len(rows)
    return out


def run_worker(impl: str, argv: list[str]) -> dict:
    cmd = [sys.executable, "-m", "bench.grpo_step", "--worker", impl, *argv]
    # Two malloc arenas on both sides: freed memory parked in per-thread arenas would otherwise
    # dominate the RSS of models this small.
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]), TOKENIZERS_PARALLELISM="false",
               MALLOC_ARENA_MAX="2")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    line = next((x for x in proc.stdout.splitlines()[::-1] if x.startswith("{")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"{impl} worker failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(line)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", choices=list(VARIANTS), help=argparse.SUPPRESS)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--completion", type=int, default=32)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds of the three runs")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    if args.worker:
        import torch

        torch.set_num_threads(args.threads)
        impl, ckpt = VARIANTS[args.worker]
        rows = (worker_trace if impl == "trace" else worker_trl)(args, gradient_checkpointing=ckpt)
        print(json.dumps(summarize(rows)))
        return 0
    argv = [a for a in sys.argv[1:] if a not in ("--no-write",)]
    argv = [a for i, a in enumerate(argv) if not (a == "--rounds" or (i and argv[i - 1] == "--rounds"))]
    results: dict[str, list[dict]] = {k: [] for k in VARIANTS}
    order = list(VARIANTS)
    for r in range(args.rounds):
        for impl in (order if r % 2 == 0 else order[::-1]):
            res = run_worker(impl, argv)
            results[impl].append(res)
            print(impl, json.dumps(res), flush=True)
    best = {k: {p: statistics.median(x[p] for x in v) for p in (*PHASES, "peak_delta_mib", "peak_mib")}
            for k, v in results.items()}
    body = render(args, best)
    print(body)
    if not args.no_write:
        from bench.harness import write_section

        write_section("grpo_step", body)
    return 0


def render(args, best: dict[str, dict]) -> str:
    from bench.harness import machine

    cmd = shlex.join([".venv/bin/python", "-m", "bench.grpo_step", *sys.argv[1:]])
    lines = [
        "## GRPO iteration: TRACE trainer vs TRL GRPOTrainer",
        "",
        f"- command: `{cmd}`",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- machine: {machine()}; load average (1/5/15 min) at the end: "
        + "/".join(f"{x:.1f}" for x in os.getloadavg()) + " (shared machine: expect noise)",
        f"- work per iteration: Qwen3 {args.layers} layers x {args.hidden} hidden (tied embeddings), "
        f"{args.groups} groups x {args.G} completions of <= {args.completion} tokens after a ~100-token shared "
        f"system prompt, LoRA r={args.rank} all-linear, beta=0, dapo loss, {args.threads} torch threads, "
        f"MALLOC_ARENA_MAX=2; medians of {args.reps} iterations after {args.warmup} warm-up, median over "
        f"{args.rounds} alternating rounds",
        "- target: TRACE step time <= 1.0x TRL's at <= 1.0x its memory (TRACE with its defaults against TRL "
        "with its defaults -- gradient checkpointing on -- and against TRL without checkpointing)",
        "",
        "| phase | TRACE | TRL (default, grad ckpt) | TRACE / TRL | TRL (no ckpt) | TRACE / TRL no ckpt | "
        "TRACE with grad ckpt |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    a, d, b, c = best["trace"], best["trl"], best["trl-nogc"], best["trace-gc"]

    def ratio(x: float, y: float) -> str:
        return f"{x / y:.2f}x" if y else "n/a"
    for ph in PHASES:
        lines.append(f"| {ph} s | {a[ph]:.3f} | {d[ph]:.3f} | {ratio(a[ph], d[ph])} | {b[ph]:.3f} | "
                     f"{ratio(a[ph], b[ph])} | {c[ph]:.3f} |")
    for key, label in (("peak_delta_mib", "peak RSS above the model-loaded baseline, MiB"),
                       ("peak_mib", "peak RSS, MiB")):
        lines.append(f"| {label} | {a[key]:.0f} | {d[key]:.0f} | {ratio(a[key], d[key])} | {b[key]:.0f} | "
                     f"{ratio(a[key], b[key])} | {c[key]:.0f} |")
    verdict = []
    for name, y in (("vs TRL default", d), ("vs TRL no ckpt", b)):
        verdict.append(f"{name}: step {'met' if a['step'] <= y['step'] else '**missed**'}, memory "
                       f"{'met' if a['peak_delta_mib'] <= y['peak_delta_mib'] else '**missed**'}")
    lines += ["", "- targets: " + "; ".join(verdict),
              "- ratio = TRACE / TRL (below 1 is better for TRACE). With num_iterations=1 both sides compute the "
              "token logprobs once, with grad (old logprobs = detached). TRACE runs the prompt prefix the batch "
              "shares once in the training forward (KV expanded to the rows) and reuses its KV cache in "
              "generation; TRL runs `model.generate` and the forward on every full sequence. Under gradient "
              "checkpointing TRACE cannot share the prefix (a checkpointed layer cannot keep a KV cache), which "
              "is why its checkpointed run is slower and larger here: checkpointing pays off only for models "
              "whose activations, not the shared prompt, dominate."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
