"""`tracectl agents`: build, ship and check the built-in base agents on this machine (no services).

  tracectl agents build micro [--cache-dir D]      resolve it now (install the shipped artifact, or build),
                                                   with progress: a bar on a terminal, plain lines elsewhere
  tracectl agents ship micro [--cache-dir D]       build it from the current code in a fresh cache and write
                                                   trace_common/agents/shipped/micro/ (model + build record),
                                                   then check it (the command every mismatch message names)
  tracectl agents verify micro [--steps N]         check the shipped artifact against the current code: file
                                                   sha256s, config/data/code digests, first N losses replayed
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from trace_common.agents import BUILT_IN, read_meta, resolve_base_agent
from trace_common.agents.progress import BuildEvent
from trace_common.errors import TraceError
from tracectl import exits
from tracectl.inputs import positive_int, writable_dir
from tracectl.progress import Reporter

console = Console(stderr=True)
SHIPPABLE = ("micro",)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("agents", help="build / ship / verify the built-in base agents (micro, smollm2)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=exits.epilog(0, 1, 2, 3, c0="built / shipped / the artifact matches the current code",
                                           c1="the build failed, or the artifact does not match the current code "
                                              "(the message names the rebuild command)",
                                           c2="bad input, nothing started: an unknown agent name, a --steps below "
                                              "1, a --cache-dir that is not a writable directory",
                                           c3="a shipped file fails its sha256 check"))
    p.add_argument("action", choices=("build", "ship", "verify"))
    p.add_argument("name", help=f"a built-in base agent: {', '.join(BUILT_IN)} (ship/verify: micro)")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="build: the agent cache (default $TRACE_AGENT_CACHE or ~/.cache/trace/agents); ship: where "
                        "to build (default: a fresh temporary directory, so nothing cached is reused)")
    p.add_argument("--steps", type=positive_int, default=20,
                   help="ship/verify: optimizer steps replayed, at least 1 (default 20)")
    p.add_argument("--out", type=Path, default=None, help="ship/verify: the artifact directory "
                   "(default trace_common/agents/shipped/NAME)")
    p.set_defaults(func=cmd_agents)


def show_events(report: Reporter):
    """BuildEvents -> the Reporter: steps as completed/total, the phase as stage, the rest as detail."""
    def show(event: BuildEvent) -> None:
        report.update(event.step, event.total, event.phase, event.detail().removeprefix(": "))
    return show


def cmd_agents(args: argparse.Namespace) -> int:
    if args.name not in BUILT_IN:
        print(f"tracectl agents: {args.name!r} is not a built-in base agent ({', '.join(BUILT_IN)})", file=sys.stderr)
        return 2
    if args.action != "build" and args.name not in SHIPPABLE:
        print(f"tracectl agents {args.action}: only {', '.join(SHIPPABLE)} is shipped", file=sys.stderr)
        return 2
    try:
        if args.cache_dir is not None and args.action != "verify":  # before any work: one line, exit 2
            writable_dir(args.cache_dir, "--cache-dir")
        elif args.action == "build" and os.environ.get("TRACE_AGENT_CACHE"):   # the cache the build defaults to
            writable_dir(Path(os.environ["TRACE_AGENT_CACHE"]), "TRACE_AGENT_CACHE",
                         "Point TRACE_AGENT_CACHE at a directory this user can write (it is created when missing), "
                         "or give --cache-dir")
        return {"build": cmd_build, "ship": cmd_ship, "verify": cmd_verify}[args.action](args)
    except TraceError as err:
        print(f"tracectl agents {args.action} {args.name}: {err.code}: {err.reason}", file=sys.stderr)
        return exits.for_error(err)


def cmd_build(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    with Reporter(f"base agent {args.name}", console) as report:
        model_dir = resolve_base_agent(args.name, args.cache_dir, progress=show_events(report))
        report.finish("ready")
    meta = read_meta(model_dir) or {}
    print(f"{model_dir}  ({meta.get('source', 'cached')}; resolved in {time.perf_counter() - started:.1f} s)")
    return 0


def cmd_ship(args: argparse.Namespace) -> int:
    from trace_common.agents import shipped

    dest = args.out or shipped.shipped_dir(args.name)
    with tempfile.TemporaryDirectory(prefix="trace-ship-") as tmp:
        cache = args.cache_dir or Path(tmp)
        with Reporter(f"base agent {args.name}", console) as report:
            model_dir = shipped.build_fresh(args.name, cache, progress=show_events(report))
            report.finish("built")
        meta = read_meta(model_dir)
        if meta is None or meta.get("source") != "built":
            print(f"tracectl agents ship: {model_dir} was not built by this code (source "
                  f"{(meta or {}).get('source')}); give an empty --cache-dir", file=sys.stderr)
            return 1
        record = shipped.write_artifact(model_dir, meta, dest)
    size = sum(f["size"] for f in record["files"].values())
    print(f"wrote {dest} ({len(record['files'])} files, {size / 1e6:.1f} MB; key {record['key']}; "
          f"built in {record['build_seconds']:.0f} s)")
    return _verify(args.name, dest, args.steps)


def cmd_verify(args: argparse.Namespace) -> int:
    from trace_common.agents import shipped

    return _verify(args.name, args.out or shipped.shipped_dir(args.name), args.steps)


def _verify(name: str, artifact: Path, steps: int) -> int:
    from trace_common.agents import shipped

    summary = shipped.check(name, artifact=artifact, steps=steps, log=lambda s: print(f"verify: {s}", file=sys.stderr))
    print(f"{artifact}: matches the current code (key {summary['key']}; {summary['steps']} steps replayed in "
          f"{summary['seconds']:.0f} s)")
    from trace_common.agents.guided_probe import close_to_teacher_of
    from trace_common.errors import InvalidArgument

    # What the build measured on dev, against issue #31's criterion: informational, exit 0 either way.
    try:
        verdict = close_to_teacher_of(shipped.read_record(artifact))
    except InvalidArgument as err:
        print(f"close to its teacher: no verdict ({err})")
        return 0
    if verdict is not None:
        split, met, lines = verdict
        print(f"close to its teacher (guidance probe, {split} split): {'yes' if met else 'no'}")
        for line in lines:
            print(f"  {line}")
    return 0
