"""`tracectl up` and `tracectl status`."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from trace_common.config import SERVICE_NAMES
from trace_common.grpc.client import Endpoint
from tracectl.embedded import EmbeddedStack, read_state
from tracectl.health import check

console = Console(stderr=False)


def register(sub: argparse._SubParsersAction) -> None:
    up = sub.add_parser("up", help="start all five services in-process (embedded default)")
    up.add_argument("--root", type=Path, default=Path(".trace"), help="artifact store directory (default ./.trace)")
    up.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    up.add_argument("--token", default=os.environ.get("TRACE_AUTH_TOKEN"),
                    help="require this bearer token (default: $TRACE_AUTH_TOKEN, unset = no auth)")
    up.add_argument("--once", action="store_true", help="start, check health, print, stop (smoke test)")
    up.set_defaults(func=cmd_up)

    st = sub.add_parser("status", help="health of each service")
    st.add_argument("--root", type=Path, default=Path(".trace"), help="where `tracectl up` wrote embedded.json")
    st.add_argument("--target", action="append", default=[], metavar="SERVICE=HOST:PORT",
                    help="check this address instead (repeatable); default: the running embedded stack")
    st.add_argument("--token", default=os.environ.get("TRACE_AUTH_TOKEN"), help="bearer token")
    st.set_defaults(func=cmd_status)


def _health_table(targets: dict[str, str], token: str | None) -> tuple[Table, bool]:
    table = Table(title="TRACE services")
    for col in ("service", "address", "health", "latency"):
        table.add_column(col)
    all_ok = True
    for name in SERVICE_NAMES:
        if name not in targets:
            table.add_row(name, "-", "[yellow]not configured[/]", "")
            all_ok = False
            continue
        h = check(name, Endpoint(targets[name], token))
        all_ok &= h.ok
        shown = f"[green]{h.status}[/]" if h.ok else f"[red]{h.status}[/] {h.detail}"
        table.add_row(name, h.target, shown, f"{h.latency_ms:.1f} ms")
    return table, all_ok


def cmd_up(args: argparse.Namespace) -> int:
    async def main() -> int:
        stack = EmbeddedStack(root=args.root, host=args.host, token=args.token)
        console.print(f"starting the embedded TRACE stack (artifacts under {args.root.resolve()}) ...")
        await stack.start()
        try:
            table, ok = await asyncio.to_thread(_health_table, stack.targets, args.token)
            console.print(table)
            metrics = Table(title="Prometheus /metrics")
            metrics.add_column("service")
            metrics.add_column("url")
            for name, url in stack.metrics_urls.items():
                metrics.add_row(name, url)
            console.print(metrics)
            if args.once:
                console.print("all five services healthy" if ok else "[red]some services are not healthy[/]")
                return 0 if ok else 1
            console.print(f"addresses written to {stack.state_file}; Ctrl-C to stop")
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
            console.print("stopping ...")
            return 0
        finally:
            await stack.stop()

    return asyncio.run(main())


def cmd_status(args: argparse.Namespace) -> int:
    targets: dict[str, str] = {}
    for t in args.target:
        name, sep, addr = t.partition("=")
        if not sep or name not in SERVICE_NAMES or not addr:
            print(f"--target {t!r}: expected SERVICE=HOST:PORT with SERVICE one of {', '.join(SERVICE_NAMES)}",
                  file=sys.stderr)
            return 2
        targets[name] = addr
    if not targets:
        state = read_state(args.root)
        if state is None:
            print(f"no running embedded stack found ({args.root / 'embedded.json'} missing): start one with "
                  "`tracectl up`, or pass --target SERVICE=HOST:PORT", file=sys.stderr)
            return 1
        targets = state["targets"]
    table, ok = _health_table(targets, args.token)
    console.print(table)
    return 0 if ok else 1
