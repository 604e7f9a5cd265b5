"""`tracectl up` and `tracectl status`.

Tokens: `up` gives each service the token in TRACE_<SERVICE>_AUTH_TOKEN when set, else `--token`
(default $TRACE_AUTH_TOKEN), else none (tracectl/embedded.py); its table shows where each
service's token comes from, or that it runs without auth. `status` sends each service
TRACE_<SERVICE>_AUTH_TOKEN when set, else `--token` / $TRACE_AUTH_TOKEN -- so in the environment
`up` was started in it sends what each service expects -- and reports per service whether auth
is on and whether its token was accepted (a refused token makes the exit status 1).

Which services `status` checks: those addressed by `--target SERVICE=HOST:PORT` or
TRACE_<SERVICE>_TARGET (read as every other command reads them, tracectl/connect.py), and only
those -- the others are neither shown nor counted; with no address given, all five of the stack
`tracectl up` recorded in `<--root>/embedded.json`.
Exit status: 0 all checked services healthy (and every token sent accepted), 1 otherwise, 2 bad
arguments or a blank / malformed token. `up`: 0 (`--once`: all five healthy), 1 (`--once`: not),
2 bad input with nothing left running: a blank / malformed token or TRACE_* setting, a `--root`
that is not a writable directory or on which another `tracectl up` runs (its pid is named), a
`--host` that cannot be listened on.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path

import grpc
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from trace_common.config import SERVICE_NAMES, service_token, token_env
from trace_common.grpc.client import Endpoint, messages, open_channel, stub
from tracectl import exits
from tracectl.connect import parse_targets
from tracectl.embedded import EmbeddedStack, read_state
from tracectl.health import check

console = Console(stderr=False)

#: A side-effect-free call per service that needs the token: (method, request fields).
AUTH_PROBES = {"rollout": ("ListRolloutJobs", {"page_size": 1}), "analysis": ("ListAnalysisJobs", {"page_size": 1}),
               "environment": ("ListGenerationJobs", {"page_size": 1}),
               "trainer": ("ListTrainingJobs", {"page_size": 1}), "inference": ("ListCompositions", {})}


def auth_probe(service: str, ep: Endpoint, timeout: float = 5.0) -> str:
    """"OK" when `service` at `ep` answers a call with `ep.token` (none: no token), else the status name."""
    method, fields = AUTH_PROBES[service]
    request = getattr(messages(service), f"{method}Request")(**fields)
    with open_channel(ep) as ch:
        try:
            getattr(stub(service, ch), method)(request, timeout=timeout)
            return "OK"
        except grpc.RpcError as err:
            return err.code().name


def auth_cell(service: str, target: str, token: str | None, where: str) -> tuple[str, bool]:
    """(what the auth column shows, whether it is fine): off / token accepted / refused / no token."""
    anonymous = auth_probe(service, Endpoint(target))
    if anonymous == "OK":
        return "[yellow]off[/] (no token needed)", True
    if anonymous != "UNAUTHENTICATED":
        return "-", True  # unreachable: the health column says why
    if token is None:
        return f"[yellow]on, no token sent[/]: set {where}", True
    got = auth_probe(service, Endpoint(target, token))
    if got == "UNAUTHENTICATED":
        return f"[red]token refused[/] (sent from {where})", False
    return "[green]token accepted[/]", True


def register(sub: argparse._SubParsersAction) -> None:
    up = sub.add_parser("up", help="start all five services in-process (embedded default)",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog=exits.epilog(0, 1, 2, c0="stopped by Ctrl-C / SIGTERM; --once: all five services "
                                            "healthy", c1="--once: some service is not healthy",
                                            c2="bad input, nothing left running: a blank or malformed token or "
                                               "TRACE_* setting, a --root that is not a writable directory or on "
                                               "which another `tracectl up` runs (its pid is named), a --host "
                                               "that cannot be listened on"))
    up.add_argument("--root", type=Path, default=Path(".trace"), help="artifact store directory (default ./.trace)")
    up.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    up.add_argument("--token", default=None,
                    help="require this bearer token on every service whose TRACE_<SERVICE>_AUTH_TOKEN is unset "
                    "(default: $TRACE_AUTH_TOKEN; neither = no auth on those services)")
    up.add_argument("--once", action="store_true", help="start, check health, print, stop (smoke test)")
    up.set_defaults(func=cmd_up)

    st = sub.add_parser("status", help="health of each service",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog=exits.epilog(0, 1, 2, c0="every service checked is healthy (and accepted the token "
                                            "sent)", c1="some service checked is not healthy or refused the token, "
                                            "or no running embedded stack was found",
                                            c2="bad input: a malformed --target, or a blank or malformed token"))
    st.add_argument("--root", type=Path, default=Path(".trace"), help="where `tracectl up` wrote embedded.json")
    st.add_argument("--target", action="append", default=[], metavar="SERVICE=HOST:PORT",
                    help="check this service at this address, and only the services so addressed (repeatable; "
                         "TRACE_<SERVICE>_TARGET too); default: the running embedded stack's five")
    st.add_argument("--token", default=os.environ.get("TRACE_AUTH_TOKEN"),
                    help="bearer token for services whose TRACE_<SERVICE>_AUTH_TOKEN is unset ($TRACE_AUTH_TOKEN)")
    st.set_defaults(func=cmd_status)


def _health_table(targets: dict[str, str], tokens: dict[str, tuple[str | None, str]],
                  auth: dict[str, str] | None = None, *, only_named: bool = False) -> tuple[Table, bool]:
    """Health per service; the auth column is `auth[name]` when given (what `up` configured),
    else probed with `tokens[name]` = (token, where it comes from). A service `targets` lacks is a
    "not configured" row that fails the check, unless `only_named` (the services addressed by
    --target / TRACE_<SERVICE>_TARGET are the ones asked about): then it is left out."""
    table = Table(title="TRACE services")
    for col in ("service", "address", "health", "auth", "latency"):
        table.add_column(col)
    all_ok = True
    for name in SERVICE_NAMES:
        if name not in targets and only_named:
            continue
        if name not in targets:
            table.add_row(name, "-", "[yellow]not configured[/]", "", "")
            all_ok = False
            continue
        token, where = tokens[name]
        h = check(name, Endpoint(targets[name], token))
        all_ok &= h.ok
        shown = f"[green]{h.status}[/]" if h.ok else f"[red]{h.status}[/] {h.detail}"
        if auth is not None:
            cell = auth[name]
        else:
            cell, fine = auth_cell(name, targets[name], token, where) if h.ok else ("-", True)
            all_ok &= fine
        table.add_row(name, h.target, shown, cell, f"{h.latency_ms:.1f} ms")
    return table, all_ok


def client_tokens(fallback: str | None) -> dict[str, tuple[str | None, str]]:
    """service -> (token a client sends, where it comes from); ValueError for a blank variable."""
    where = "--token / TRACE_AUTH_TOKEN"
    return {name: (service_token(name, fallback),
                   token_env(name) if os.environ.get(token_env(name)) is not None else f"{token_env(name)} or {where}")
            for name in SERVICE_NAMES}


def cmd_up(args: argparse.Namespace) -> int:
    token, source = args.token, "--token"
    if token is None and os.environ.get("TRACE_AUTH_TOKEN") is not None:
        token, source = os.environ["TRACE_AUTH_TOKEN"], "TRACE_AUTH_TOKEN"

    async def main() -> int:
        stack = EmbeddedStack(root=args.root, host=args.host, token=token, token_source=source,
                              cwd_model_root=False,  # long-lived: the working directory is no model root
                              exclusive=not args.once)  # a second long-lived `up` on one root is refused
        console.print(f"starting the embedded TRACE stack (artifacts under {args.root.resolve()}) ...")
        try:
            await stack.start()
        except (ValueError, ValidationError) as err:  # a blank / malformed token, bad TRACE_* settings
            print(f"tracectl up: {_one_line(err)}", file=sys.stderr)
            return 2
        try:
            tokens = {name: (tok, src or "") for name, (tok, src) in stack.auth.items()}
            auth = {name: f"[green]token[/] from {src}" if tok is not None else "[yellow]off[/] (no auth)"
                    for name, (tok, src) in stack.auth.items()}
            table, ok = await asyncio.to_thread(_health_table, stack.targets, tokens, auth)
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
            console.print(f"addresses written to {stack.state_file}; Ctrl-C to stop" if stack.owns_state else
                          f"another stack owns {stack.state_file}: this one is not recorded there; Ctrl-C to stop")
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
    targets = parse_targets(args.target)  # --target and TRACE_<SERVICE>_TARGET; InvalidArgument: exit 2
    only_named = bool(targets)
    state = None
    if not targets:
        state = read_state(args.root)
        if state is None:
            print(f"no running embedded stack found ({args.root / 'embedded.json'} missing): start one with "
                  "`tracectl up`, or pass --target SERVICE=HOST:PORT", file=sys.stderr)
            return 1
        targets = state["targets"]
    try:
        tokens = client_tokens(args.token)
    except ValueError as err:
        print(f"tracectl status: {err}", file=sys.stderr)
        return 2
    recorded = state.get("auth") if state else None
    if isinstance(recorded, dict):  # `up` recorded where each service's token comes from: name it
        for name, info in recorded.items():
            if name in tokens and tokens[name][0] is None and isinstance(info, dict) and info.get("token_from"):
                tokens[name] = (None, str(info["token_from"]))
    table, ok = _health_table(targets, tokens, only_named=only_named)
    console.print(table)
    return 0 if ok else 1


def _one_line(err: Exception) -> str:
    """A settings error as one line: the field and pydantic's message (its 'Value error, ' prefix dropped)."""
    if isinstance(err, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg'].removeprefix('Value error, ')}"
                         for e in err.errors())
    return str(err)
