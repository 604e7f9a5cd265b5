"""`tracectl`: drive TRACE from a terminal.

  tracectl up [--once]         start all five services in this process (embedded default)
  tracectl status              health of each service (embedded, or --target svc=host:port)
  tracectl run|rollout|analyze|envs|train|serve|report   pipeline stages
  tracectl agents|route-trace  build/verify base agents; one generation's routing trace
  tracectl tau2 replay-gold    tau2-bench gold replay (where available)

Every subcommand is registered by a module of `tracectl/commands/` through its `register(subparsers)`
function; most modules hold one subcommand of their name, `run.py` holds run and report (one run's
manifest), `stack.py` up and status (the embedded stack), `route_trace.py` route-trace.
Exit statuses are one table for every command (tracectl/exits.py): 0 done, 1 the work failed,
2 bad input (nothing started), 3 stored data damaged, 4 `envs generate` rejected a candidate,
130 interrupted. A domain error or a gRPC status that reaches `main` is printed as one line
("tracectl COMMAND: reason") with its status from that table, never as a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import grpc

from trace_common.errors import TraceError
from trace_common.malloc import limit_arenas_or_exit
from tracectl import commands, exits


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tracectl", description="TRACE: capability-targeted training "
                                     "from an agent's recurring failures.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for mod in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"tracectl.commands.{mod.name}")
        if hasattr(module, "register"):
            module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    limit_arenas_or_exit("tracectl")  # before any thread: the embedded services keep models in this process
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = exits.INTERRUPTED
    except TraceError as err:  # bad input here, or damaged stored data: one line, its exit status
        print(f"tracectl {args.command}: {err}", file=sys.stderr)
        code = exits.for_error(err)
    except grpc.RpcError as err:  # the service said no: show its reason, not a traceback
        print(f"tracectl {args.command}: {err.code().name}: {err.details()}", file=sys.stderr)
        code = exits.for_status(err.code().name)
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
