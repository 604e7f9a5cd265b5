"""`tracectl up` and `tracectl status`.

Tokens: `up` gives each service the token in TRACE_<SERVICE>_AUTH_TOKEN when set, else `--token`
(default $TRACE_AUTH_TOKEN), else none (tracectl/embedded.py); its table shows where each
service's token comes from, or that it runs without auth. `status` sends each service
TRACE_<SERVICE>_AUTH_TOKEN when set, else `--token` / $TRACE_AUTH_TOKEN -- so in the environment
`up` was started in it sends what each service expects -- and reports per service whether auth
is on and whether its token was accepted (a refused token makes the exit status 1).
Exit status: 0 all healthy (and every token sent accepted), 1 otherwise, 2 bad arguments or a
blank / malformed token.
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
    up = sub.add_parser("up", help="start all five services in-process (embedded default)")
    up.add_argument("--root", type=Path, default=Path(".trace"), help="artifact store directory (default ./.trace)")
    up.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    up.add_argument("--token", default=None,
                    help="require this bearer token on every service whose TRACE_<SERVICE>_AUTH_TOKEN is unset "
                    "(default: $TRACE_AUTH_TOKEN; neither = no auth on those services)")
    up.add_argument("--once", action="store_true", help="start, check health, print, stop (smoke test)")
    up.set_defaults(func=cmd_up)

    st = sub.add_parser("status", help="health of each service")
    st.add_argument("--root", type=Path, default=Path(".trace"), help="where `tracectl up` wrote embedded.json")
    st.add_argument("--target", action="append", default=[], metavar="SERVICE=HOST:PORT",
                    help="check this address instead (repeatable); default: the running embedded stack")
    st.add_argument("--token", default=os.environ.get("TRACE_AUTH_TOKEN"),
                    help="bearer token for services whose TRACE_<SERVICE>_AUTH_TOKEN is unset ($TRACE_AUTH_TOKEN)")
    st.set_defaults(func=cmd_status)


def _health_table(targets: dict[str, str], tokens: dict[str, tuple[str | None, str]],
                  auth: dict[str, str] | None = None) -> tuple[Table, bool]:
    """Health per service; the auth column is `auth[name]` when given (what `up` configured),
    else probed with `tokens[name]` = (token, where it comes from)."""
    table = Table(title="TRACE services")
    for col in ("service", "address", "health", "auth", "latency"):
        table.add_column(col)
    all_ok = True
    for name in SERVICE_NAMES:
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
                              cwd_model_root=False)  # long-lived: the working directory is no model root
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
    table, ok = _health_table(targets, tokens)
    console.print(table)
    return 0 if ok else 1


def _one_line(err: Exception) -> str:
    """A settings error as one line: the field and pydantic's message (its 'Value error, ' prefix dropped)."""
    if isinstance(err, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg'].removeprefix('Value error, ')}"
                         for e in err.errors())
    return str(err)
