"""Pipeline subcommands whose implementation arrives with later work.

They exist so the command structure is stable; each says exactly what is missing and exits
with status 3 instead of pretending to work.
"""

from __future__ import annotations

import argparse
import sys

PENDING = {
    "train": ("train capability adapters with GRPO", "the trainer issue"),
}


def register(sub: argparse._SubParsersAction) -> None:
    for name, (help_text, issue) in PENDING.items():
        p = sub.add_parser(name, help=f"{help_text} (not available yet)")
        p.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        p.set_defaults(func=_pending(name, issue))


def _pending(name: str, issue: str):
    def run(_args: argparse.Namespace) -> int:
        print(f"tracectl {name}: not available yet; it arrives with {issue}.", file=sys.stderr)
        return 3
    return run
