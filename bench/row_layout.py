"""GRPO's training forward + backward on real multi-turn rows, by how a micro-batch is laid out.

The question: on a CPU, a micro-batch of right-padded rows run with its attention mask goes
through PyTorch's math SDPA kernel, which keeps every [B, heads, T, T] attention matrix for the
backward pass -- for SmolLM2 rows of ~2,000 tokens that dominated the worker's memory (the
smollm2 run's workers were OOM-killed). `services.trainer.grpo.logprobs` now drops the mask of
right-padded rows (exact for a causal model: see its docstring). This bench measures, per
micro-batch of real rows, the time of `selected_logprobs(...)` + `backward()` with a LoRA
adapter attached, and the process's peak RSS, for each layout:

    trl-style  model(input_ids, attention_mask).logits -> log_softmax at the targets: the
               per-token logprob forward TRL's GRPOTrainer runs (the named peer); full logits
    masked     TRACE before this change: backbone with the mask, vocabulary projection at the
               targets only (what still runs for left-padded rows)
    prefix     TRACE's shared-prefix path: the rows' common system prompt + tools once, the
               suffixes with a [B, 1, T-P, T] mask (trainer default when P >= 16)
    unmasked   TRACE now for right-padded rows without a shared prefix: no mask, `is_causal`

Rows: the sequences the trainer would build (`batch.build_sequences`) from real trajectories
(default: the smollm2 run's first rollout file): a micro-batch of the 2 longest (~2,300 tokens,
a third of it the shared system prompt + tools) and one of 2 median-length rows (~900 tokens,
mostly that prefix). Each (layout, micro-batch) runs in its own process (peak RSS is per
process), after one warm-up pass (which counts in the peak); times are medians over `--reps`.

    .venv/bin/python -m bench.row_layout              # writes the row_layout section of bench/RESULTS.md
    .venv/bin/python -m bench.row_layout --reps 1 --layouts unmasked --no-write   # a trial
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.grpo_step import model_loaded_baseline, rss_kib
from bench.harness import command_line, machine, write_section

LAYOUTS = ("trl-style", "masked", "prefix", "unmasked")
DEFAULT_TRAJECTORIES = ".trace/runs/smollm2/rollouts/*/trajectories.jsonl"


def load_rows(path: str) -> dict[str, list[dict]]:
    """Two micro-batches of 2 sequences (input_ids, target) from the trajectories at `path`: the two
    longest sequences, and the two around the median length (neighbours in length, as
    `batch.micro_batches` pairs them)."""
    from services.trainer.grpo.batch import TrainEpisode, build_sequences, episode_turns
    from trace_common.env import Trajectory

    files = sorted(glob.glob(path))
    if not files:
        sys.exit(f"no trajectories at {path}: run `tracectl run --config examples/smollm2.yaml` to its rollout "
                 "stage first, or pass --trajectories FILE (a rollout's trajectories.jsonl with token ids)")
    episodes = []
    with open(files[0], encoding="utf-8") as fh:
        for line in fh:
            t = Trajectory.model_validate_json(line)
            episodes.append(TrainEpisode(group=0, index=len(episodes), seed=t.seed, reward=t.reward, advantage=1.0,
                                         guided=False, turns=episode_turns(t, guided=False, render=None)))
    seqs = sorted(build_sequences(episodes), key=len)
    mid = len(seqs) // 2
    picks = {"longest": seqs[-2:], "median": seqs[mid - 1:mid + 1]}
    return {k: [{"input_ids": s.input_ids, "target": s.target} for s in v] for k, v in picks.items()}


def child(layout: str, data: Path, which: str, reps: int, model_ref: str) -> None:
    import torch

    from services.trainer.grpo.config import GRPOConfig
    from services.trainer.grpo.logprobs import _parts, selected_logprobs, shared_prefix_len
    from services.trainer.grpo.lora import attach_lora
    from services.trainer.grpo.models import load_base
    from trace_common.model_refs import UNCONFINED

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    batches = [json.loads(data.read_text())[which]]
    base, tok, _ = load_base(model_ref, cache_dir=Path(tempfile.gettempdir()) / "trace-bench-models",
                            allowed=UNCONFINED)
    model = attach_lora(base, GRPOConfig(seed=0))
    model.train()
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    tensors = []
    for rows in batches:
        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        att = torch.zeros_like(ids)
        tgt = torch.zeros_like(ids, dtype=torch.bool)
        for b, r in enumerate(rows):
            n = len(r["input_ids"])
            ids[b, :n] = torch.tensor(r["input_ids"])
            att[b, :n] = 1
            tgt[b, :n] = torch.tensor(r["target"])
        tensors.append((ids, att, tgt, shared_prefix_len(ids, att, tgt)))
    backbone, head = _parts(model)

    def step(ids, att, tgt, p) -> None:
        sel = tgt[:, 1:]
        if layout == "trl-style":
            logits = model(input_ids=ids, attention_mask=att).logits[:, :-1].float()      # [B, T-1, V]
            logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)[sel]
        elif layout == "masked":
            h = backbone(input_ids=ids, attention_mask=att).last_hidden_state[:, :-1][sel]  # [N, H]
            logp = torch.log_softmax(head(h).float(), -1).gather(-1, ids[:, 1:][sel][:, None]).squeeze(-1)
        else:
            logp, _ = selected_logprobs(model, ids, att, tgt, with_entropy=False,
                                        prefix_len=p if layout == "prefix" else 0)
        logp.sum().backward()
        model.zero_grad(set_to_none=True)

    base_kib = model_loaded_baseline()                 # model + adapter loaded; the peak counts from here
    step(*tensors[0])                                  # warm-up (allocator, kernels)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step(*tensors[0])
        times.append(time.perf_counter() - t0)
    peak = rss_kib("VmHWM")
    print(json.dumps({"layout": layout, "batch": which, "seconds": statistics.median(times),
                      "shape": list(tensors[0][0].shape), "prefix": tensors[0][3],
                      "peak_delta_mib": (peak - base_kib) / 1024, "peak_mib": peak / 1024}))


def render(results: dict[tuple[str, str], dict], args: argparse.Namespace) -> str:
    lines = [
        "## GRPO training forward + backward by micro-batch layout (SmolLM2 rows, CPU)", "",
        f"- command: `{command_line('bench.row_layout')}`",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- machine: {machine()}",
        f"- work: model `{args.model}` + LoRA (TRACE defaults); a micro-batch of the 2 longest and one of 2 "
        f"median-length real rows from `{args.trajectories}`; `selected_logprobs` (or the peer's forward) + "
        f"backward, median of {args.reps} passes after one warm-up; each layout and micro-batch in its own "
        "process (peak RSS above the loaded model counts the warm-up too)",
        "- target: `unmasked` (TRACE's layout for right-padded rows) below `masked` (the same computation with "
        "the mask) and below the TRL-style peer, in time and in memory, on the longest rows", "",
        "| micro-batch | shared prefix | layout | s | time vs trl-style | time vs masked | peak RSS above model, MiB "
        "| memory vs trl-style | memory vs masked |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for which in ("longest", "median"):
        peer, ref = results[("trl-style", which)], results[("masked", which)]
        for name in LAYOUTS:
            r = results[(name, which)]
            b, t = r["shape"]
            lines.append(f"| {which} {b}x{t} | {r['prefix']} | {name} | {r['seconds']:.1f} | "
                         f"{r['seconds'] / peer['seconds']:.2f}x | {r['seconds'] / ref['seconds']:.2f}x | "
                         f"{r['peak_delta_mib']:.0f} | {r['peak_delta_mib'] / peer['peak_delta_mib']:.2f}x | "
                         f"{r['peak_delta_mib'] / ref['peak_delta_mib']:.2f}x |")
    u, ref, peer = (results[(k, "longest")] for k in ("unmasked", "masked", "trl-style"))
    ratios = [u[k] / r[k] for r in (ref, peer) for k in ("seconds", "peak_delta_mib")]
    lines += ["", f"- longest rows, unmasked / masked: time {ratios[0]:.2f}x, memory {ratios[1]:.2f}x; unmasked / "
              f"trl-style: time {ratios[2]:.2f}x, memory {ratios[3]:.2f}x: target "
              f"{'met' if max(ratios) < 1 else '**MISSED**'}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trajectories", default=DEFAULT_TRAJECTORIES)
    ap.add_argument("--model", default="smollm2", help="built-in base agent or model directory")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--child", choices=LAYOUTS, help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--batch", choices=("longest", "median"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.data, args.batch, args.reps, args.model)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "rows.json"
        data.write_text(json.dumps(load_rows(args.trajectories)))
        results = {}
        for which in ("longest", "median"):
            for layout in args.layouts.split(","):
                out = subprocess.run([sys.executable, "-m", "bench.row_layout", "--child", layout, "--batch", which,
                                      "--data", str(data), "--reps", str(args.reps), "--model", args.model],
                                     capture_output=True, text=True, env={**os.environ, "MALLOC_ARENA_MAX": "2"})
                if out.returncode != 0:
                    sys.exit(f"layout {layout} failed (rc {out.returncode}):\n{out.stderr[-3000:]}")
                r = results[(layout, which)] = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"{which:8s} {layout:10s} {r['shape']} prefix {r['prefix']}: {r['seconds']:.1f} s, "
                      f"peak +{r['peak_delta_mib']:.0f} MiB", flush=True)
    if len(results) == 2 * len(LAYOUTS):
        body = render(results, args)
        print(body)
        if not args.no_write:
            write_section("row_layout", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
