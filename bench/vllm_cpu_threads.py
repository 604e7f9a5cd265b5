"""vLLM-CPU decoding threads on every core (`VLLM_CPU_NUM_OF_RESERVED_CPU=0`, what `tracectl rehearse`
and the vLLM tests set: `tracectl.rehearsal.local.VLLM_CPU_DECODING_ENV`) vs vLLM's default (its
`auto` binding keeps one core out of the decoding threads for its scheduler process).

Both servers serve the converted SmolLM2-135M-Instruct (the rehearsal's model) with the rehearsal's
CPU flags and are up at once; the requests alternate between them (bench/harness.py), so both see
the same background load. One repetition is what a tau2 rollout asks of the server: 2 parallel chat
completions of 48 tokens (the rehearsal's `max_completion_length`, `ignore_eos` so every reply is
48 tokens) after a ~5.5k-token system prompt already in the prefix cache (tau2 retail's is ~6k).

Target: >= 1.2x replies per second (peer median time / TRACE median time) on this project's 2-core
machines. With one core both sides are the same.

    .venv/bin/python -m bench.vllm_cpu_threads [--reps 6] [--no-write]     # ~5 min here
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

import httpx

from bench.harness import Case, command_line, run_case, write_section
from bench.harness import machine as machine_info
from tests.support.vllm import SERVED_NAME, VLLMServer
from trace_common.agents import default_cache_dir, smollm2_base_dir
from tracectl.rehearsal.local import VLLM_CPU_DECODING_ENV, VLLM_CPU_FLAGS

TARGET = 1.2
TOKENS = 48
PARALLEL = 2
SYSTEM = " ".join(f"Rule {i}: the agent verifies the order status before it changes the order." for i in range(380))


class Server(VLLMServer):
    """The tests' vLLM server (tests/support/vllm.py) with the rehearsal's CPU flags, no LoRA, and
    vLLM's own defaults for every VLLM_CPU_* setting but the KV cache and `env`."""

    def __init__(self, model: Path, env: dict[str, str], workdir: Path):
        workdir.mkdir(parents=True)
        flags = [x for f, v in VLLM_CPU_FLAGS for x in (f, v) if x is not None]
        super().__init__(model, workdir, args=["--max-model-len", "8192", *flags],
                         env={**{k: v for k, v in os.environ.items() if not k.startswith("VLLM_CPU_")},
                              "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", **env})

    def round(self, turn: int) -> None:
        async def one(client: httpx.AsyncClient, i: int) -> None:
            r = await client.post(f"{self.base_url}/chat/completions", timeout=600, json={
                "model": SERVED_NAME, "max_tokens": TOKENS, "ignore_eos": True, "temperature": 1.0, "seed": i,
                "messages": [{"role": "system", "content": SYSTEM},
                             {"role": "user", "content": f"Hello, I am customer {i}, message {turn}."}]})
            r.raise_for_status()

        async def both() -> None:
            async with httpx.AsyncClient() as client:
                await asyncio.gather(*(one(client, i) for i in range(PARALLEL)))

        asyncio.run(both())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if cpus < 2:
        raise SystemExit("one CPU for this process: both sides would be the same")
    model = smollm2_base_dir(default_cache_dir())
    logs = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    ours = Server(model, VLLM_CPU_DECODING_ENV, logs / "ours")
    try:
        peer = Server(model, {}, logs / "default")
        try:
            turns = iter(range(10**6))
            row = run_case(Case(op="round", nbytes=PARALLEL * TOKENS, reps=args.reps,
                                trace=lambda: ours.round(next(turns)), peer=lambda: peer.round(next(turns))))
        finally:
            peer.stop()
    finally:
        ours.stop()
    t, p = row.trace_median, row.peer_median
    print(f"no core reserved: {t:.2f} s per round; vLLM default: {p:.2f} s; ratio {row.ratio:.2f} "
          f"(paired {row.pair_ratio:.2f})", flush=True)
    body = "\n".join([
        "## vLLM-CPU decoding threads: every core vs vLLM's default", "",
        f"- command: `{command_line('bench.vllm_cpu_threads')}`",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- machine: {machine_info()}; load average at the end: {'/'.join(f'{x:.1f}' for x in os.getloadavg())}",
        "- peer: vLLM-CPU 0.32 with its defaults (`auto` binding, one core kept out of decoding for the scheduler)",
        f"- target: ratio >= {TARGET:g} (peer median time / TRACE median time per round)", "",
        "| round | reps | TRACE s (VLLM_CPU_NUM_OF_RESERVED_CPU=0) | peer s (defaults) | ratio | paired ratio | target |",
        "|---|---:|---:|---:|---:|---:|---|",
        f"| {PARALLEL} x {TOKENS} tokens after a ~5.5k-token cached prompt | {row.reps} | {t:.2f} | {p:.2f} | "
        f"{row.ratio:.2f} | {row.pair_ratio:.2f} | {'ok' if row.ratio >= TARGET else '**MISS**'} |", ""])
    if not args.no_write:
        write_section("vllm_cpu_threads", body)
    print(body)


if __name__ == "__main__":
    main()
