"""Measure a base agent on the built-in domain's test split and print its report: a built-in
name (resolved, so built or installed first if need be) or a local HF model directory.

    python -m trace_common.agents.evaluate_cli micro --episodes 200
    python -m trace_common.agents.evaluate_cli /path/to/hf-model-dir --episodes 40 --json out.json

Episodes are sampled at temperature 1 with top_k=0 / top_p=1 (the rollout setting) unless
`--temperature` says otherwise; `evaluate.py` says why.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from trace_common.agents.evaluate import evaluate_model_dir
from trace_common.agents.resolve import resolve_base_agent


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("agent", help="micro | smollm2 | a local HF model directory")
    parser.add_argument("--episodes", type=int, default=200, help="test seeds to play (default: all 200)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="base agent cache (default $TRACE_AGENT_CACHE)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--json", type=Path, default=None, help="also write the report as JSON here")
    args = parser.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = resolve_base_agent(args.agent, args.cache_dir, log=lambda s: print(s, file=sys.stderr, flush=True))
    report = asyncio.run(evaluate_model_dir(model_dir, agent=args.agent, episodes=args.episodes, seed=args.seed,
                                            temperature=args.temperature))
    print(report.format())
    if args.json:
        args.json.write_text(json.dumps(report.to_dict(), indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
