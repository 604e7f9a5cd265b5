"""`tracectl serve`: run the inference service locally with a composition loaded.

    tracectl serve --composition file:///.../runs/r1/moe/composition.json
    tracectl serve --base micro --adapter refunds=file:///.../adapters/refunds/v3 \\
        --adapter addresses=... --gates file:///.../gates.safetensors --name demo
    tracectl serve --composition URI --routing per_request      # export mode check (see below)

Prints the gRPC address (trace.v1.InferenceService), the OpenAI-compatible base URL (give it
to any OpenAI client, e.g. the rollout service's HTTP backend, as `endpoint`, with the
composition name as the model) and the metrics URL, then serves until Ctrl-C / SIGTERM.
`--routing per_request | merged` serves one of the export modes instead of token-level routing
(trace_common/moe/composition_io.py documents their accuracy trade-off). `--once` loads,
prints and stops (a smoke test). Exit status: 0, or 1 when the composition does not load
(the reason is printed).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

from rich.console import Console

from trace_common.errors import TraceError

console = Console()


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a composition locally (gRPC + OpenAI-compatible HTTP)")
    add_composition_args(p)
    p.add_argument("--name", default="", help="composition name clients use as the model (default: "
                   "the manifest's directory name, or 'composition')")
    p.add_argument("--routing", choices=("token", "per_request", "merged"), default="token",
                   help="token-level routing (default) or an export mode")
    p.add_argument("--host", default="127.0.0.1", help="bind address of gRPC, HTTP and metrics")
    p.add_argument("--port", type=int, default=0, help="gRPC port (0 = free port)")
    p.add_argument("--http-port", type=int, default=0, help="OpenAI-compatible HTTP port (0 = free port)")
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus port (0 = free port)")
    p.add_argument("--root", type=Path, default=Path(".trace"), help="artifact store directory (default ./.trace)")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda:0")
    p.add_argument("--once", action="store_true", help="load, print the addresses, stop")
    p.set_defaults(func=cmd_serve)


def add_composition_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--composition", default="", help="composition manifest URI (composition.json written by gate "
                   "training)")
    p.add_argument("--base", default="", help="base model (dir, artifact URI or built-in name) when no manifest")
    p.add_argument("--adapter", action="append", default=[], metavar="NAME=URI",
                   help="capability adapter (repeatable, slot order) when no manifest")
    p.add_argument("--gates", default="", help="gates.safetensors URI when no manifest")


def composition_spec(args: argparse.Namespace, name: str):
    """A validated CompositionSpecModel from --composition or --base/--adapter/--gates."""
    from services.inference.specs import AdapterRefModel, CompositionSpecModel
    from trace_common.moe.composition_io import read_manifest

    if args.composition:
        manifest = read_manifest(args.composition)
        name = name or args.composition.rstrip("/").rsplit("/", 2)[-2].replace("/", "-") or "composition"
        return CompositionSpecModel(name=name, base_model=manifest.base_model, gates_uri=manifest.gates_uri,
                                    adapters=[AdapterRefModel(name=a.name, uri=a.uri) for a in manifest.adapters])
    if not args.base:
        raise SystemExit("give --composition URI, or --base (with --adapter NAME=URI ... and --gates URI)")
    adapters = []
    for item in args.adapter:
        adapter_name, sep, uri = item.partition("=")
        if not sep or not adapter_name or not uri:
            raise SystemExit(f"--adapter {item!r}: expected NAME=URI")
        adapters.append(AdapterRefModel(name=adapter_name, uri=uri))
    return CompositionSpecModel(name=name or "composition", base_model=args.base, adapters=adapters,
                                gates_uri=args.gates)


def cmd_serve(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from services.launch import build
    from trace_common.grpc.server import TraceServer

    try:
        spec = composition_spec(args, args.name)
    except (TraceError, ValidationError) as exc:
        console.print(f"[red]tracectl serve:[/] {exc}")
        return 1

    async def main() -> int:
        settings, definition = build("inference", host=args.host, port=args.port, http_host=args.host,
                                     http_port=args.http_port, metrics_host=args.host, metrics_port=args.metrics_port,
                                     artifact_root=args.root.resolve().as_uri(), device=args.device)
        server = TraceServer(settings, definition)
        await server.start()
        try:
            domain = definition.domain
            console.print(f"loading composition [bold]{spec.name}[/] (base {spec.base_model}, "
                          f"{len(spec.adapters)} adapters, routing {args.routing}) ...")
            try:
                info = await domain.load(spec, routing=args.routing)
            except TraceError as exc:
                console.print(f"[red]tracectl serve: cannot load the composition:[/] {exc.code}: {exc}")
                return 1
            console.print(f"experts: {', '.join(['base', *[a['name'] for a in info['adapters']]])}; "
                          f"{info['num_layers']} layers, hidden {info['hidden_size']}, "
                          f"{info['gate_parameters']} gate parameters")
            console.print(f"grpc={server.target} http={definition.http_url} metrics={server.metrics_server.url} "
                          f"model={spec.name}", highlight=False, soft_wrap=True)
            if args.once:
                return 0
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            console.print("serving; Ctrl-C to stop")
            await stop.wait()
            return 0
        finally:
            await server.stop(grace=2.0)

    return asyncio.run(main())
