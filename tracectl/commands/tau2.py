"""`tracectl tau2 ...`: tau2-bench utilities.

  tracectl tau2 replay-gold --data DIR --out FILE [--domain retail] [--no-progress]

replay-gold executes every task's gold actions on a fresh database with TRACE's tau2 tool
implementation and writes `{task_id: {"outputs": [...], "final_db_sha256": ...}}` (see
`trace_common.domains.tau2.replay`); progress is drawn on stderr (`tracectl.progress.Reporter`),
a one-line JSON summary goes to stdout. Exit status 2 names a data problem (missing or
malformed files, a file that is not UTF-8 text) in one line; `--out` is written only on success.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack

from trace_common.errors import TraceError
from tracectl import exits
from tracectl.inputs import DATA_MAX_BYTES, read_json


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("tau2", help="tau2-bench utilities (gold replay)",
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog=exits.epilog(0, 2, c2="a data problem, nothing written: a missing or malformed "
                                                "tau2 file, or one that is not UTF-8 text (replay-gold --help)"))
    tau2_sub = parser.add_subparsers(dest="tau2_command", metavar="SUBCOMMAND", required=True)
    replay = tau2_sub.add_parser("replay-gold", help="replay every task's gold actions on a fresh DB and "
                                 "write tool outputs + final DB sha256 per task",
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=exits.epilog(0, 2, c2="a data problem, nothing written: a missing or "
                                                     "malformed tau2 file, or one that is not UTF-8 text"))
    replay.add_argument("--data", default=None,
                        help="tau2 data root (holding retail/, user_simulator/) or a domain directory; "
                             "default $TRACE_TAU2_DATA (README: tau2-bench data)")
    replay.add_argument("--domain", default=None, help="domain under --data (default: retail)")
    replay.add_argument("--out", required=True, help="JSON file to write")
    replay.add_argument("--no-progress", action="store_true", help="do not draw the progress bar")
    replay.set_defaults(func=replay_gold_command)


def check_task_files(args: argparse.Namespace) -> None:
    """tasks.json (a list) and split_tasks.json (a mapping, when present) of the domain `--data` names,
    read as tracectl reads every input file (tracectl/inputs.py); InvalidArgument / NotFound otherwise."""
    from trace_common.domains.tau2.data import resolve_domain_dir

    directory = resolve_domain_dir(args.data, args.domain)
    fix = "restore the file from tau2-bench"
    read_json(directory / "tasks.json", "--data", list, fix=fix, max_bytes=DATA_MAX_BYTES)
    if (directory / "split_tasks.json").is_file():
        read_json(directory / "split_tasks.json", "--data", dict, fix=fix)


def replay_gold_command(args: argparse.Namespace) -> int:
    """Run replay-gold from parsed arguments; domain errors print one line and return 2."""
    from trace_common.domains.tau2.replay import write_replay_gold
    from tracectl.progress import Reporter

    with ExitStack() as stack:
        state: dict = {}

        def on_start(name: str, total: int) -> None:
            if not args.no_progress:
                state["report"] = stack.enter_context(Reporter(f"replay-gold {name}"))
            state.update(total=total, done=0)

        def progress(_task_id: str) -> None:
            state["done"] += 1
            if "report" in state:
                state["report"].update(state["done"], state["total"], "tasks replayed")

        try:
            check_task_files(args)   # the files a user edits, checked first: one line each, like every command
            summary = write_replay_gold(args.data, args.out, domain=args.domain, on_start=on_start,
                                        progress=progress)
        except TraceError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return exits.BAD_INPUT
        except UnicodeDecodeError as exc:  # a text file of the data (policy.md, user guidelines) is binary
            print(f"error: a file under --data is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                  f"{exc.start}); restore the tau2-bench data directory", file=sys.stderr)
            return exits.BAD_INPUT
        if "report" in state:
            state["report"].finish("done")
    print(json.dumps(summary))
    return 0
