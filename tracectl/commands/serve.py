"""`tracectl serve`: load a composition into the inference service and print where it is served.

    tracectl serve --composition file:///.../runs/r1/moe/composition.json
    tracectl serve --base micro --adapter refunds=file:///.../adapters/refunds/v3 \\
        --adapter addresses=... --gates file:///.../gates.safetensors --name demo
    tracectl serve --composition URI --routing per_request      # export mode check (see below)
    tracectl serve --composition URI --target inference=HOST:PORT   # onto a running service

Like every other command, serve is a client of the inference service: it sends the composition
with LoadComposition (`CompositionSpec.routing` from `--routing`) and prints what the service
answered -- its experts, layers, hidden size, gate parameters and the routing it serves.

Without `--target`, the inference service is first started in this process (through
`services.launch.build`, as the embedded stack starts services) on `--host`/`--port`/
`--http-port`/`--metrics-port`, with its artifact store under `--root`; serve then prints the gRPC
address (trace.v1.InferenceService), the OpenAI-compatible base URL (give it to any OpenAI client,
e.g. the rollout service's HTTP backend, as `endpoint`, with the composition name as the model)
and the metrics URL, and serves until Ctrl-C / SIGTERM. With `--target [inference=]HOST:PORT`
(or $TRACE_INFERENCE_TARGET) nothing is started: the composition is loaded on that service, its
answer printed, and the command returns while the service keeps serving it (token:
$TRACE_INFERENCE_AUTH_TOKEN, else `--token` / $TRACE_AUTH_TOKEN).

`--routing per_request | merged` serves one of the export modes instead of token-level routing
(trace_common/moe/composition_io.py documents their accuracy trade-off). `--once` loads, prints
and stops (a smoke test). `--composition` is read here, by tracectl (a path -- relative ones
against the working directory -- or a file:// or s3:// URI). Exit status (tracectl/exits.py): 0;
1 when the composition does not load (one line: the service's status code and reason); 2 bad
input, nothing served (a flag: neither --composition nor --base, a malformed --adapter or
--target, a blank --token, a --host / --port / --http-port / --metrics-port that cannot be
listened on, a --root that is not a writable directory, a --composition that is no manifest; or
a composition the service refused as INVALID_ARGUMENT); 3 a manifest whose sha256 record is
missing or wrong (or DATA_LOSS from the service).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
from rich.console import Console

from trace_common.errors import InvalidArgument, PermissionDenied, TraceError
from trace_common.specs import COMPOSITION_NAME_RE
from tracectl import exits
from tracectl.embedded import is_loopback
from tracectl.exits import BAD_INPUT
from tracectl.inputs import port_number

console = Console()
ROUTING_CHOICES = ("token", "per_request", "merged", "soft_trajectory")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a composition (gRPC + OpenAI-compatible HTTP), here or on a service",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=exits.epilog(0, 1, 2, 3, c0="served until Ctrl-C / SIGTERM (--once: loaded and "
                                           "stopped; --target: loaded there)",
                                           c1="the composition did not load (the service's status code and reason)",
                                           c2="bad input, nothing started: a flag (no --composition or --base, a "
                                              "malformed --adapter or --target, a blank --token, a --host or port "
                                              "that cannot be listened on, an unusable --root) or a composition "
                                              "the service refused as INVALID_ARGUMENT",
                                           c3="stored data is damaged: the sha256 record of the --composition manifest (or of a "
                                              "file it names) is missing or wrong"))
    add_composition_args(p)
    p.add_argument("--name", default="", help="composition name clients use as the model (default: "
                   "the manifest's directory name, or 'composition')")
    p.add_argument("--routing", choices=ROUTING_CHOICES, default="token",
                   help="token-level routing (default), an export mode, or soft_trajectory (the soft ablation)")
    add_inference_target_args(p, what="load the composition on a running inference service instead of "
                              "starting one here")
    p.add_argument("--host", default="127.0.0.1", help="bind address of gRPC, HTTP and metrics")
    p.add_argument("--port", type=port_number, default=0, help="gRPC port (0 = free port)")
    p.add_argument("--http-port", type=port_number, default=0, help="OpenAI-compatible HTTP port (0 = free port)")
    p.add_argument("--metrics-port", type=port_number, default=0, help="Prometheus port (0 = free port)")
    p.add_argument("--root", type=Path, default=Path(".trace"), help="artifact store directory (default ./.trace)")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda:0")
    p.add_argument("--once", action="store_true", help="load, print the addresses, stop")
    p.set_defaults(func=cmd_serve)


def add_composition_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--composition", default="", help="composition manifest (composition.json written by gate "
                   "training): a path, or a file:// or s3:// URI")
    p.add_argument("--base", default="", help="base model (dir, artifact URI or built-in name) when no manifest")
    p.add_argument("--adapter", action="append", default=[], metavar="NAME=URI",
                   help="capability adapter (repeatable, slot order) when no manifest")
    p.add_argument("--gates", default="", help="gates.safetensors URI when no manifest")


def add_inference_target_args(p: argparse.ArgumentParser, *, what: str) -> None:
    p.add_argument("--target", default="", metavar="[inference=]HOST:PORT", help=what)
    p.add_argument("--token", default=None, help="bearer token: sent to --target, or required by the service "
                   "started here ($TRACE_INFERENCE_AUTH_TOKEN wins when set, as for every command; default "
                   "$TRACE_AUTH_TOKEN)")


def inference_target(args: argparse.Namespace) -> str:
    """HOST:PORT of the inference service to call: --target (an `inference=` prefix is allowed), else
    $TRACE_INFERENCE_TARGET; empty = start one in this process."""
    target = args.target or os.environ.get("TRACE_INFERENCE_TARGET", "")
    name, sep, addr = target.partition("=")
    if sep:
        if name != "inference" or not addr:
            where = "--target" if args.target else "TRACE_INFERENCE_TARGET"
            raise InvalidArgument(field=where, expected="[inference=]HOST:PORT", got=target,
                                  fix="e.g. --target inference=127.0.0.1:50055 (the inference service's gRPC address)")
        return addr
    return target


def target_token(args: argparse.Namespace) -> str | None:
    """The token a deployed inference service is sent: $TRACE_INFERENCE_AUTH_TOKEN, else --token /
    $TRACE_AUTH_TOKEN (`trace_common.config.service_token`)."""
    from trace_common.config import check_token, service_token

    try:
        if args.token is not None:
            fallback = check_token(args.token, "--token")
        elif "TRACE_AUTH_TOKEN" in os.environ:
            fallback = check_token(os.environ["TRACE_AUTH_TOKEN"], "TRACE_AUTH_TOKEN")
        else:
            fallback = None
        return service_token("inference", fallback)
    except ValueError as exc:  # a blank or malformed token (the message names the flag or variable)
        raise InvalidArgument(str(exc)) from None


def composition_spec(args: argparse.Namespace, name: str, routing: str = "token"):
    """The `trace.v1.CompositionSpec` of --composition (its manifest is read here) or of
    --base/--adapter/--gates; the service validates it. TraceError when the manifest cannot be read."""
    from trace_common.grpc.client import messages
    from trace_common.specs import COMPOSITION_ROUTING

    inf = messages("inference")
    if args.composition:
        from trace_common.model_refs import UNCONFINED
        from trace_common.moe.composition_io import read_manifest

        ref = manifest_ref(args.composition)
        try:  # the user's own file, read here, wherever it lies
            manifest = read_manifest(ref, allowed=UNCONFINED, field="--composition")
        except PermissionDenied:  # only a reference with no local or s3 form, e.g. http:// or file://relative
            raise InvalidArgument(field="--composition", got=args.composition,
                                  expected="the path of a composition.json (relative to the working directory, "
                                  "or absolute), or a file:///ABSOLUTE or s3://BUCKET/KEY URI") from None
        if not name:  # the composition's directory names it when that is a valid name
            derived = ref.rstrip("/").rsplit("/", 2)[-2].replace("/", "-")
            name = derived if COMPOSITION_NAME_RE.match(derived) else "composition"
        return inf.CompositionSpec(name=name, base_model=manifest.base_model, gates_uri=manifest.gates_uri,
                                   adapters=[inf.AdapterRef(name=a.name, uri=a.uri) for a in manifest.adapters],
                                   routing=COMPOSITION_ROUTING[routing])
    if not args.base:
        raise InvalidArgument(field="--composition / --base", expected="one of them",
                              fix="Give --composition composition.json, or --base MODEL (with --adapter NAME=URI ... "
                                  "and --gates URI)")
    adapters = []
    for item in args.adapter:
        adapter_name, sep, uri = item.partition("=")
        if not sep or not adapter_name or not uri:
            raise InvalidArgument(field="--adapter", expected="NAME=URI", got=item,
                                  fix="e.g. --adapter refunds=file:///abs/run/adapters/refunds/v3")
        adapters.append(inf.AdapterRef(name=adapter_name, uri=uri))
    return inf.CompositionSpec(name=name or "composition", base_model=args.base, adapters=adapters,
                               gates_uri=args.gates, routing=COMPOSITION_ROUTING[routing])


def manifest_ref(ref: str) -> str:
    """`--composition` as the manifest reader takes it: a path without a scheme (`composition.json`,
    `run/moe/composition.json`) as its absolute path, since tracectl reads the user's own file and
    resolves it against the working directory; URIs unchanged."""
    if not ref or "://" in ref:
        return ref
    return str(Path(ref).expanduser().absolute())


@dataclass
class InferenceHere:
    """An inference service started in this process: where to call it and what it serves on."""

    target: str
    token: str | None
    http_url: str | None
    metrics_url: str | None


def distinct_ports(ports: dict[str, int]) -> None:
    """InvalidArgument naming both flags where two listeners are given the same port (0, any free port,
    may repeat): the one started second would otherwise fail on a port its own service holds."""
    seen: dict[int, str] = {}
    for flag, port in ports.items():
        if port and port in seen:
            raise InvalidArgument(f"{seen[port]} and {flag} are both {port}: each listener needs a port of its own",
                                  field=f"{flag} {port}", fix="Give different ports, or 0 for any free one")
        seen.setdefault(port, flag)


@contextlib.asynccontextmanager
async def inference_in_process(*, root: Path, host: str = "127.0.0.1", port: int = 0, http_port: int = 0,
                               metrics_port: int = 0, spec=None, **settings) -> AsyncIterator[InferenceHere]:
    """Start the inference service in this process (TRACE_INFERENCE_* env vars apply; the keyword
    arguments win), yield how to reach it, stop it on exit. tracectl's one way to start it itself.
    Its model roots are tracectl's (`tracectl.embedded.local_model_roots`, without the working
    directory: this server lives on) plus the directories the
    CompositionSpec `spec` names (the user named them: tracectl is this service's operator)."""
    from pydantic import ValidationError

    from services.launch import build
    from trace_common.grpc.server import TraceServer
    from tracectl.embedded import check_host, local_model_roots, model_dirs, start_listening
    from tracectl.inputs import writable_dir

    refs = [spec.base_model, spec.gates_uri, *(a.uri for a in spec.adapters)] if spec is not None else []
    distinct_ports({"--port": port, "--http-port": http_port, "--metrics-port": metrics_port})
    writable_dir(root, "--root")
    check_host(host)
    try:
        service_settings, definition = build("inference", host=host, port=port, http_host=host,
                                             http_port=http_port, metrics_host=host, metrics_port=metrics_port,
                                             artifact_root=root.resolve().as_uri(),
                                             model_roots=local_model_roots("inference", model_dirs(*refs), cwd=False),
                                             **settings)
    except ValidationError as err:  # e.g. a blank TRACE_INFERENCE_AUTH_TOKEN
        first = err.errors()[0]
        raise InvalidArgument(first["msg"].removeprefix("Value error, "),
                              field=f"inference settings (env TRACE_INFERENCE_*): "
                                    f"{'.'.join(map(str, first['loc'])) or '-'}") from None
    server = TraceServer(service_settings, definition)
    await start_listening(server, {"host": "--host", "grpc": "--port", "metrics": "--metrics-port",
                                   "http": "--http-port"})
    try:
        token = service_settings.auth_token.get_secret_value() if service_settings.auth_token is not None else None
        yield InferenceHere(target=server.target, token=token, http_url=definition.http_url,
                            metrics_url=server.metrics_server.url if server.metrics_server else None)
    finally:
        await server.stop(grace=2.0)


@contextlib.asynccontextmanager
async def inference_stub(target: str, token: str | None) -> AsyncIterator[tuple[object, tuple]]:
    """(asyncio stub of trace.v1.InferenceService at `target`, the call metadata carrying `token`)."""
    from trace_common.grpc.client import Endpoint, call_metadata, open_aio_channel, stub

    endpoint = Endpoint(target, token)
    channel = open_aio_channel(endpoint)
    try:
        yield stub("inference", channel), call_metadata(endpoint)
    finally:
        await channel.close()


def served_routing(spec) -> str:
    """The routing mode a CompositionInfo's spec names ("token", ...; the bare number of a value
    this build does not know, from a newer service)."""
    from trace_common.grpc.client import messages
    from trace_common.specs import composition_routing_mode

    enum = messages("inference").CompositionRouting
    if spec.routing not in enum.values():
        return str(spec.routing)
    try:
        return composition_routing_mode(enum.Name(spec.routing))
    except ValueError:  # a value this build's mapping (trace_common.specs) does not name yet
        return enum.Name(spec.routing)


def describe(info) -> str:
    """One line saying what a LoadCompositionResponse's CompositionInfo reports."""
    spec = info.spec
    return (f"experts: {', '.join(['base', *[a.name for a in spec.adapters]])}; {info.num_layers} layers, "
            f"hidden {info.hidden_size}, {info.gate_parameters} gate parameters; routing {served_routing(spec)}")


def cmd_serve(args: argparse.Namespace) -> int:
    target = inference_target(args)
    token = target_token(args)   # sent to --target, or required by the service started here
    if not target and token is None and not is_loopback(args.host):
        console.print(f"[red]tracectl serve:[/] --host {args.host} would serve the composition beyond this machine "
                      "without auth: set --token, $TRACE_AUTH_TOKEN or $TRACE_INFERENCE_AUTH_TOKEN (or bind "
                      "127.0.0.1)", highlight=False, soft_wrap=True)
        return BAD_INPUT
    try:
        spec = composition_spec(args, args.name, args.routing)
    except TraceError as exc:  # bad input: 2; a damaged manifest: 3; one that is not there: 1
        console.print(f"[red]tracectl serve:[/] {exc.code}: {exc}", highlight=False, soft_wrap=True)
        return exits.for_error(exc)

    async def load(where: str, tok: str | None):
        from trace_common.grpc.client import messages

        console.print(f"loading composition [bold]{spec.name}[/] (base {spec.base_model}, "
                      f"{len(spec.adapters)} adapters, routing {args.routing}) on {where} ...")
        async with inference_stub(where, tok) as (stub, metadata):
            try:
                resp = await stub.LoadComposition(messages("inference").LoadCompositionRequest(spec=spec),
                                                  metadata=metadata)
            except grpc.RpcError as exc:
                console.print(f"[red]tracectl serve: cannot load the composition:[/] {exc.code().name}: "
                              f"{exc.details()}", highlight=False, soft_wrap=True)
                return exits.for_status(exc.code().name)  # INVALID_ARGUMENT: 2, DATA_LOSS: 3, else 1
        console.print(describe(resp.composition), highlight=False, soft_wrap=True)
        return resp.composition

    async def main() -> int:
        if target:
            info = await load(target, token)
            if isinstance(info, int):
                return info
            console.print(f"grpc={target} model={info.spec.name}", highlight=False, soft_wrap=True)
            return 0
        auth = {"auth_token": token} if token is not None else {}
        async with inference_in_process(root=args.root, host=args.host, port=args.port, http_port=args.http_port,
                                        metrics_port=args.metrics_port, device=args.device, spec=spec, **auth) as here:
            info = await load(here.target, here.token)
            if isinstance(info, int):
                return info
            console.print(f"grpc={here.target} http={here.http_url} metrics={here.metrics_url} "
                          f"model={info.spec.name} auth={'bearer-token' if here.token else 'none'}",
                          highlight=False, soft_wrap=True)
            if args.once:
                return 0
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            console.print("serving; Ctrl-C to stop")
            await stop.wait()
            return 0

    return asyncio.run(main())
