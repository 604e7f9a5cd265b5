"""Side-by-side cost of token-level top-1 LoRA routing (TRACE) against its peers, in one run.

Variants, all on the same random Qwen3 base (float32, CPU, no grad):

* base                 -- the plain model;
* merged               -- one adapter folded into the weights (PEFT merge_and_unload);
* peft                 -- one adapter, unmerged (PEFT LoRA layers);
* trace K=2/4/8        -- `ComposedMoEModel`, hard top-1 per token per layer (grouped path for
                          prefill, gathered small-batch path for decode steps);
* dense K=2/4/8        -- soft mixture computing all K adapter deltas, weighted by the gate softmax.

The TRACE gates are random with the base slot disabled (slot-0 bias -1e4), so every token goes
to some adapter and the tokens are spread over all K: the most adapter work and the most
groups per linear the routed path can face (real gates that send tokens to the base do less).

Measured: prefill (one forward over batch x prompt tokens, no cache) and greedy KV-cache decode
(time of generate(1 + D new tokens) minus generate(1 new token), so the prompt is excluded).
Variants are interleaved within every repetition; the table reports the best of N repetitions
(ratios use it) with the median in parentheses. The default clock is the process's CPU time with
one torch thread: on a shared machine, elapsed time mostly measures the other processes.

    .venv/bin/python -m bench.moe_routing                  # ~2-4 min, rewrites its section of bench/RESULTS.md
    .venv/bin/python -m bench.moe_routing --no-write       # trial run, prints only
    .venv/bin/python -m bench.moe_routing --quick          # tiny smoke run (implies --no-write)
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import Qwen3Config, Qwen3ForCausalLM

from bench.harness import command_line, machine, write_section
from trace_common.moe import ComposedMoEModel, MoEConfig, merge_single_adapter

SECTION = "moe_routing"
TARGET = 1.15  # TRACE routing time / PEFT single-adapter time, at every K, prefill and decode


def build(args, root: Path):
    config = Qwen3Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                         num_key_value_heads=max(1, args.hidden // 128), head_dim=64,
                         max_position_embeddings=1024)
    torch.manual_seed(0)
    state = Qwen3ForCausalLM(config).state_dict()

    def fresh():
        model = Qwen3ForCausalLM(config)
        model.load_state_dict(state)
        return model.eval()

    dirs = []
    for k in range(max(args.ks)):
        torch.manual_seed(100 + k)
        peft_model = get_peft_model(fresh(), LoraConfig(r=args.rank, lora_alpha=2 * args.rank,
                                                        target_modules="all-linear", init_lora_weights=False))
        with torch.no_grad():  # keep the random adapters small so decoded tokens stay sane
            for name, param in peft_model.named_parameters():
                if "lora_B" in name:
                    param.mul_(0.01)
        peft_model.save_pretrained(str(root / f"cap{k}"))
        dirs.append(root / f"cap{k}")
    return config, fresh, dirs


def spread_gates(model: ComposedMoEModel, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for gate in model.gates:
            gate.weight.copy_(torch.randn(gate.weight.shape, generator=generator) * 10.0)
            gate.bias.zero_()
            gate.bias[0] = -1e4  # no token to the base slot: worst case for the routed path


class ForcedToOne:
    """A composed model with every token forced to adapter 1: the per-request export path in process."""

    def __init__(self, model: ComposedMoEModel):
        self.model = model

    def __call__(self, **kwargs):
        with self.model.forced(1):
            return self.model(**kwargs)

    def generate(self, **kwargs):
        with self.model.forced(1):
            return self.model.generate(**kwargs)


def variants(args, fresh, dirs):
    out = {"base": fresh(), "merged": merge_single_adapter(fresh(), dirs[0]),
           "peft": PeftModel.from_pretrained(fresh(), str(dirs[0])).eval()}
    for k in args.ks:
        for kind, impl in (("trace", "grouped"), ("dense", "dense_soft")):
            model = ComposedMoEModel.from_adapter_dirs(fresh(), dirs[:k], config=MoEConfig(implementation=impl))
            spread_gates(model, seed=k)
            model.eval()
            out[f"{kind} K={k}"] = model
    k_max = max(args.ks)
    out[f"trace K={k_max}, forced to 1 adapter"] = ForcedToOne(out[f"trace K={k_max}"])
    return out


def routing_spread(model: ComposedMoEModel, ids) -> str:
    with torch.no_grad(), model.capture_routing() as trace:
        model(input_ids=ids, use_cache=False)
    experts = trace.experts()  # [L, B, T]
    counts = torch.bincount(experts.reshape(-1), minlength=model.num_slots).float()
    share = counts / counts.sum()
    return f"base {share[0]:.0%}, adapters min/max {share[1:].min():.0%}/{share[1:].max():.0%}"


CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


def timed(fn, clock: str) -> float:
    now = CLOCKS[clock]
    start = now()
    fn()
    return now() - start


def run(args) -> tuple[list[dict], dict]:
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="moe_bench_") as root:
        config, fresh, dirs = build(args, Path(root))
        models = variants(args, fresh, dirs)  # everything is in memory once loaded
    gen = torch.Generator().manual_seed(1)
    prefill_ids = torch.randint(0, config.vocab_size, (args.batch, args.prefill_len), generator=gen)
    prompt_ids = torch.randint(0, config.vocab_size, (args.batch, args.prompt_len), generator=gen)

    def prefill(model):
        return lambda: model(input_ids=prefill_ids, use_cache=False)

    def generate(model, new):
        return lambda: model.generate(input_ids=prompt_ids, attention_mask=torch.ones_like(prompt_ids),
                                      max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)

    samples = {name: {"prefill": [], "decode": []} for name in models}
    with torch.no_grad():
        for model in models.values():  # warm-up
            prefill(model)()
            generate(model, 2)()
        for _ in range(args.reps):
            for name, model in models.items():
                samples[name]["prefill"].append(timed(prefill(model), args.clock))
                one = timed(generate(model, 1), args.clock)
                full = timed(generate(model, 1 + args.decode_tokens), args.clock)
                samples[name]["decode"].append(max(full - one, 1e-9))
    # best-of-N is the primary statistic: on a shared machine other processes only ever add time
    peft_prefill = min(samples["peft"]["prefill"])
    peft_decode = min(samples["peft"]["decode"])
    rows = []
    for name, model in models.items():
        prefill_s = min(samples[name]["prefill"])
        decode_s = min(samples[name]["decode"])
        rows.append({
            "variant": name,
            "prefill_ms": 1e3 * prefill_s,
            "prefill_ms_median": 1e3 * statistics.median(samples[name]["prefill"]),
            "prefill_tok_s": args.batch * args.prefill_len / prefill_s,
            "prefill_vs_peft": prefill_s / peft_prefill,
            "decode_tok_s": args.batch * args.decode_tokens / decode_s,
            "decode_tok_s_median": args.batch * args.decode_tokens / statistics.median(samples[name]["decode"]),
            "decode_vs_peft": decode_s / peft_decode,
            "prefill_vs_peft_median": statistics.median(samples[name]["prefill"])
            / statistics.median(samples["peft"]["prefill"]),
            "decode_vs_peft_median": statistics.median(samples[name]["decode"])
            / statistics.median(samples["peft"]["decode"]),
            "routing": (routing_spread(model, prefill_ids) if isinstance(model, ComposedMoEModel)
                        else "all tokens on adapter 1" if isinstance(model, ForcedToOne) else ""),
        })
    meta = {"config": config}
    return rows, meta


def table(rows: list[dict]) -> str:
    lines = ["| variant | prefill ms (median) | prefill tok/s | prefill time / PEFT | decode tok/s (median) "
             "| decode time / PEFT | routing (prefill tokens x layers) |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['prefill_ms']:.1f} ({r['prefill_ms_median']:.1f}) | "
                     f"{r['prefill_tok_s']:.0f} | {r['prefill_vs_peft']:.2f}x | {r['decode_tok_s']:.1f} "
                     f"({r['decode_tok_s_median']:.1f}) | {r['decode_vs_peft']:.2f}x | {r['routing']} |")
    return "\n".join(lines)


def verdict(rows: list[dict], ks: list[int]) -> list[str]:
    by = {r["variant"]: r for r in rows}
    out = []
    for phase in ("prefill", "decode"):
        worst = max(by[f"trace K={k}"][f"{phase}_vs_peft"] for k in ks)
        worst_median = max(by[f"trace K={k}"][f"{phase}_vs_peft_median"] for k in ks)
        out.append(f"- {phase}: TRACE routing time / PEFT single adapter, worst over K={ks}: {worst:.2f}x "
                   f"(target <= {TARGET}x: {'met' if worst <= TARGET else 'MISSED'}); from medians instead of "
                   f"best-of-N: {worst_median:.2f}x")
        key = f"{phase}_vs_peft"
        t_growth = by[f"trace K={ks[-1]}"][key] / by[f"trace K={ks[0]}"][key]
        d_growth = by[f"dense K={ks[-1]}"][key] / by[f"dense K={ks[0]}"][key]
        out.append(f"- {phase}: time growth K={ks[0]}->K={ks[-1]}: TRACE {t_growth:.2f}x, dense {d_growth:.2f}x")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prefill-len", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads; 1 keeps timings stable on a shared 2-core machine")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                        help="cpu: process CPU time (with 1 thread, insensitive to other processes on a shared "
                        "machine); wall: elapsed time")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, print only (smoke test)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave bench/RESULTS.md alone")
    args = parser.parse_args(argv)
    if args.quick:
        args.layers, args.hidden, args.vocab, args.reps, args.decode_tokens = 2, 128, 256, 1, 4
        args.prefill_len, args.ks = 16, [2, 4]
    rows, meta = run(args)
    report = table(rows) + "\n\n" + "\n".join(verdict(rows, args.ks))
    print(report)
    if args.quick or args.no_write:
        return 0
    cfg = meta["config"]
    clock = "process CPU time" if args.clock == "cpu" else "elapsed time"
    body = "\n".join([
        "## MoE routing: token-level top-1 LoRA routing vs single adapter / merged / dense mixture "
        "(bench/moe_routing.py)",
        "",
        f"- command: `{command_line('bench.moe_routing')}`",
        f"- date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {machine()}; load average (1/5/15 min) at the end: "
        + "/".join(f"{x:.1f}" for x in os.getloadavg()),
        f"- clock: {clock}, {args.threads} torch thread(s), float32, no grad; best of {args.reps} interleaved "
        "repetitions (median in parentheses)",
        f"- model: random Qwen3, {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, intermediate "
        f"{cfg.intermediate_size}, {cfg.num_attention_heads} heads x 64, vocab {cfg.vocab_size}; LoRA r={args.rank} "
        "on all 7 linear projections of every layer",
        f"- prefill: batch {args.batch} x {args.prefill_len} tokens, one forward without cache; decode: batch "
        f"{args.batch}, {args.prompt_len}-token prompt, {args.decode_tokens} greedy KV-cache steps "
        "(generate(1+D) - generate(1))",
        "- peers: PEFT `PeftModel` with one adapter (unmerged), the same adapter merged "
        "(`merge_and_unload`), the plain base, and a dense soft mixture computing all K adapters",
        "- TRACE gates: random, base slot disabled, tokens spread over all K adapters (the routed path's "
        "worst case: most adapter work, most groups per linear)",
        f"- target: TRACE time / PEFT single-adapter time <= {TARGET}x at every K (prefill and decode); "
        "TRACE flat in K while dense grows",
        "",
        table(rows),
        "",
        *verdict(rows, args.ks),
        "",
        "Why routed decode costs more than one PEFT adapter: a decode step "
        f"has only {args.batch} tokens, spread over up to {args.batch} different adapters, so every routed "
        "linear reads several adapters' factors where PEFT reads one adapter once (the decode step is "
        "bound by reading weights, not by arithmetic). That is inherent to per-token routing at small "
        "batch (the dense mixture pays for all K). What the routed path trims is fixed per-op cost: "
        "decode steps (at most `MoEConfig.gathered_max_tokens` tokens, no grad) take the gathered path "
        "-- no per-layer count, sort or host sync; each linear gathers every token's own factors from "
        "per-slot stacks and applies them with two batched matmuls (five tensor ops per linear, whatever "
        "K) -- while prefill takes the grouped path (one stable sort per layer, one shared input gather "
        "for q/k/v and gate/up, pre-transposed factors with the scaling folded in, one scatter-add back; "
        "no grouping at all when one slot owns every token -- the forced row).",
        "",
    ])
    write_section(SECTION, body)
    print(f"\nwritten to bench/RESULTS.md (section {SECTION})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
