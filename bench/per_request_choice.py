"""Choosing the adapter per request over real multi-turn conversations: cached against uncached.

TRACE's per-request export picks one adapter per request by the gates' mean routing over the
prompt. Played as an agent, a request is one turn, and turn k+1's prompt starts with turn k's.
The peer is the plain function, `choose_adapter_per_request`, run on each prompt (what the
evaluation's per-request arm did before `PerRequestChooser`; it prefills the whole conversation at
every turn). `PerRequestChooser` keeps the unforced composition's KV and per-token routing counts
of earlier prompts and runs only new tokens.

Work: the first `--episodes` trajectories of a rollout file with prompt token ids (default: the
smollm2 run's base rollouts), each turn's prompt in the order an evaluation sends them (turn 1 of
every episode, then turn 2, ...), through the run's composition (`--composition`, default the
smollm2 run's). Both sides choose every prompt; the slots must agree. Clock: the process's CPU
time with one torch thread (the machine may be shared), best of `--reps`.

    .venv/bin/python -m bench.per_request_choice            # writes its section of bench/RESULTS.md
    .venv/bin/python -m bench.per_request_choice --episodes 2 --reps 1 --no-write   # a trial
"""

from __future__ import annotations

import argparse
import glob
import json
import time
from pathlib import Path

from bench.harness import command_line, machine, write_section

RUN = Path(".trace/runs/smollm2")


def _default_composition() -> str:
    manifest = RUN / "manifest.json"
    if not manifest.is_file():
        return ""
    return json.loads(manifest.read_text())["stages"].get("gates", {}).get("outputs", {}).get("composition", "")


def load_prompts(path: str, episodes: int) -> list[list[int]]:
    """Every turn's prompt of the first `episodes` trajectories, in lockstep order."""
    from trace_common.env import Trajectory

    files = sorted(glob.glob(path))
    if not files:
        raise SystemExit(f"no trajectories at {path}: run `tracectl run --config examples/smollm2.yaml` through its "
                         "rollout stage, or pass --trajectories FILE")
    convs: list[list[list[int]]] = []
    with open(files[0], encoding="utf-8") as fh:
        for line in fh:
            t = Trajectory.model_validate_json(line)
            turns = [r.prompt_token_ids for r in t.turns if r.prompt_token_ids]
            if turns:
                convs.append(turns)
            if len(convs) == episodes:
                break
    return [c[k] for k in range(max(len(c) for c in convs)) for c in convs if k < len(c)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trajectories", default=str(RUN / "rollouts/*/trajectories.jsonl"))
    ap.add_argument("--composition", default=None, help="composition manifest URI (default: the smollm2 run's)")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)

    import torch

    from trace_common.model_refs import UNCONFINED
    from trace_common.moe import PerRequestChooser, choose_adapter_per_request
    from trace_common.moe.composition_io import load_composition

    torch.set_num_threads(1)
    composition = args.composition or _default_composition()
    if not composition:
        raise SystemExit("no composition: run the smollm2 example through its gates stage, or pass --composition URI")
    composed = load_composition(composition, routing="per_request", allowed=UNCONFINED).composed
    assert composed is not None
    prompts = load_prompts(args.trajectories, args.episodes)
    tokens = sum(len(p) for p in prompts)

    def uncached() -> list[int]:
        return [choose_adapter_per_request(composed, torch.tensor([p]))[0].slot for p in prompts]

    def cached() -> list[int]:
        chooser = PerRequestChooser(composed)
        slots = [chooser.choose(p).slot for p in prompts]
        cached.run_tokens = tokens - chooser.cache.reused_tokens  # type: ignore[attr-defined]
        return slots

    best = {"uncached": float("inf"), "cached": float("inf")}
    slots = {}
    for _ in range(args.reps):
        for name, fn in (("uncached", uncached), ("cached", cached)):
            t0 = time.process_time()
            slots[name] = fn()
            best[name] = min(best[name], time.process_time() - t0)
            print(f"{name:9s} {time.process_time() - t0:7.1f} s CPU", flush=True)
    agree = sum(a == b for a, b in zip(slots["uncached"], slots["cached"], strict=True))
    ratio = best["cached"] / best["uncached"]
    body = "\n".join([
        "## Per-request adapter choice over multi-turn conversations (SmolLM2 composition, CPU)", "",
        f"- command: `{command_line('bench.per_request_choice')}`",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- machine: {machine()}",
        f"- work: {len(prompts)} prompts (every turn of {args.episodes} base-agent episodes, {tokens} prompt tokens) "
        f"from `{args.trajectories}`, through `{composition}`; one torch thread, process CPU time, best of "
        f"{args.reps}",
        "- target: `PerRequestChooser` below 0.5x of the uncached peer, choosing the same slot for every prompt", "",
        "| side | CPU s | prompt tokens run | vs uncached |",
        "|---|---:|---:|---:|",
        f"| uncached `choose_adapter_per_request` (peer) | {best['uncached']:.1f} | {tokens} | 1.00x |",
        f"| `PerRequestChooser` | {best['cached']:.1f} | {cached.run_tokens} | {ratio:.2f}x |",  # type: ignore[attr-defined]
        "",
        f"- same slot for {agree}/{len(prompts)} prompts; target "
        f"{'met' if ratio < 0.5 and agree == len(prompts) else '**MISSED**'}",
    ]) + "\n"
    print(body)
    if not args.no_write:
        write_section("per_request_choice", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
