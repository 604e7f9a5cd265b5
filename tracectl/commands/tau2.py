"""`tracectl tau2 ...`: tau2-bench utilities.

  tracectl tau2 replay-gold --data DIR --out FILE [--domain retail]

replay-gold executes every task's gold actions on a fresh database with TRACE's tau2 tool
implementation and writes `{task_id: {"outputs": [...], "final_db_sha256": ...}}` (see
`trace_common.domains.tau2.replay`); progress is drawn on stderr, a one-line JSON summary
goes to stdout. Exit status 2 names a data problem (missing or malformed files).
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("tau2", help="tau2-bench utilities (gold replay)")
    tau2_sub = parser.add_subparsers(dest="tau2_command", metavar="SUBCOMMAND", required=True)
    replay = tau2_sub.add_parser("replay-gold", help="replay every task's gold actions on a fresh DB and "
                                 "write tool outputs + final DB sha256 per task")
    from trace_common.domains.tau2 import replay as replay_module

    replay_module.add_arguments(replay)
    replay.set_defaults(func=replay_module.command)
