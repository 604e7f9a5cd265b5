"""`tracectl route-trace`: generate once and show which expert produced each token.

    tracectl route-trace --composition file:///.../moe/composition.json --message "Refund order A17"
    tracectl route-trace --target inference=HOST:PORT --model demo --messages-file conv.json --per-layer

A client of the inference service, like every other command: it calls Generate with
`return_routing_trace`. With `--target [inference=]HOST:PORT` (or $TRACE_INFERENCE_TARGET) it asks
that running service about a composition it already serves (`--model`, or its only one); without,
it starts the inference service in this process (artifacts under `--root`), loads the composition
given by the same options as `tracectl serve` with LoadComposition, and asks it. The view:
a legend (one color per expert: base + each capability adapter), the reply with each token
colored by the expert most of its layers chose, and with `--per-layer` one line per layer
colored by that layer's choice; then a table of the share of tokens per expert per layer.
A token's experts are those of the forward position that produced it (see
services/inference/decoding.py). `--messages-file` holds an OpenAI messages list (JSON);
`--tools-file` a list of tool schemas. Exit status (tracectl/exits.py): 0; 1 when the service
refuses or the composition cannot be read (one line: its status code and reason); 2 bad input,
nothing generated (a flag: no --message / --messages-file, an unreadable or malformed file, a
--model the service does not serve, or a request it refused as INVALID_ARGUMENT); 3 a damaged
composition manifest.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter
from pathlib import Path

import grpc
from rich.console import Console
from rich.table import Table
from rich.text import Text

from trace_common.errors import InvalidArgument
from trace_common.suggest import closest
from tracectl import exits
from tracectl.commands.serve import (
    add_composition_args,
    add_inference_target_args,
    composition_spec,
    inference_in_process,
    inference_stub,
    inference_target,
    target_token,
)
from tracectl.inputs import positive_int, read_json, seed_int

console = Console()
PALETTE = ("bright_black", "green", "magenta", "cyan", "yellow", "blue", "red", "bright_green", "bright_magenta",
           "bright_cyan", "bright_yellow", "bright_blue", "bright_red")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("route-trace", help="generate once; show a colored token-by-expert view",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=exits.epilog(0, 1, 2, 3, c1="the service refused, or the composition could not be "
                                           "read or loaded (its status code and reason)",
                                           c2="bad input, nothing generated: a flag (no --message or "
                                              "--messages-file, an unreadable or malformed file, a --model the "
                                              "service does not serve), or a request the service refused as "
                                              "INVALID_ARGUMENT",
                                           c3="the composition manifest's sha256 record is missing or wrong"))
    add_composition_args(p)
    add_inference_target_args(p, what="ask a running inference service instead of starting one here")
    p.add_argument("--model", default="", help="composition name on the --target service")
    p.add_argument("--message", default="", help="one user message")
    p.add_argument("--system", default="", help="optional system prompt")
    p.add_argument("--messages-file", type=Path, help="JSON list of OpenAI chat messages")
    p.add_argument("--tools-file", type=Path, help="JSON list of tool schemas")
    p.add_argument("--max-tokens", type=positive_int, default=64, help="tokens to generate (default 64)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--per-layer", action="store_true", help="one colored line per layer")
    p.add_argument("--root", type=Path, default=Path(".trace"), help="artifact store directory (local mode)")
    p.set_defaults(func=cmd_route_trace)


def _conversation(args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    if args.messages_file:
        messages = read_json(args.messages_file, "--messages-file", list)  # one line, exit 2 for a bad file
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise InvalidArgument(field=f"--messages-file {args.messages_file}",
                                  expected='a JSON list of chat messages ({"role": ..., "content": ...})')
    elif args.message:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
                   [{"role": "user", "content": args.message}]
    else:
        raise InvalidArgument(field="--message / --messages-file", expected="one of them",
                              fix="Give --message TEXT or --messages-file conv.json")
    tools = read_json(args.tools_file, "--tools-file", list) if args.tools_file else []
    return messages, tools


def chat_message(m: dict):
    """An OpenAI chat message (dict) -> trace.v1.ChatMessage, tool calls included."""
    from trace_common.proto.trace.v1 import types_pb2 as t

    calls = []
    for i, tc in enumerate(m.get("tool_calls") or []):
        fn = tc.get("function") or tc
        arguments = fn.get("arguments", "{}")
        calls.append(t.ToolCall(id=tc.get("id") or f"call_{i}", name=fn.get("name") or "",
                                arguments_json=arguments if isinstance(arguments, str) else json.dumps(arguments)))
    return t.ChatMessage(role=m["role"], content=m.get("content") or "", tool_calls=calls,
                         tool_call_id=m.get("tool_call_id") or "", name=m.get("name") or "")


async def _generate(stub, metadata, args: argparse.Namespace, messages: list[dict], tools: list[dict], composition):
    """Generate with a routing trace on `composition` (a CompositionInfo): (expert names, [(token
    text, experts per layer)], finish reason)."""
    from trace_common.grpc.client import messages as pb_messages
    from trace_common.proto.trace.v1 import types_pb2 as t

    inf = pb_messages("inference")
    resp = await stub.Generate(inf.GenerateRequest(
        model=composition.spec.name, messages=[chat_message(m) for m in messages],
        tools=[t.ToolSchema(json=json.dumps(x)) for x in tools],
        sampling=t.SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed),
        return_routing_trace=True), metadata=metadata)
    names = ["base", *[a.name for a in composition.spec.adapters]]
    return names, [(r.token_text, list(r.experts)) for r in resp.routing_trace], resp.finish_reason


async def _remote(args: argparse.Namespace, target: str, messages: list[dict], tools: list[dict]):
    """Ask the service at `target` about a composition it serves (--model, or its only one)."""
    from trace_common.grpc.client import messages as pb_messages

    inf = pb_messages("inference")
    async with inference_stub(target, target_token(args)) as (stub, metadata):
        listed = {c.spec.name: c for c in (await stub.ListCompositions(inf.ListCompositionsRequest(),
                                                                       metadata=metadata)).compositions}
        model = args.model
        if not model:
            if len(listed) != 1:
                raise InvalidArgument(field="--model", expected=f"one of the compositions {target} serves: "
                                      f"{', '.join(sorted(listed)) or 'none (load one with tracectl serve --target)'}")
            model = next(iter(listed))
        if model not in listed:
            near = closest(model, sorted(listed)) if listed else None
            raise InvalidArgument(f"no composition {model!r} on {target}; loaded: {sorted(listed)}", field="--model",
                                  fix=f"Did you mean {near}?" if near else None)
        return await _generate(stub, metadata, args, messages, tools, listed[model])


async def _local(args: argparse.Namespace, messages: list[dict], tools: list[dict]):
    """Start the inference service here, load the composition through its API, ask it."""
    from trace_common.grpc.client import messages as pb_messages

    spec = composition_spec(args, "route-trace")
    async with inference_in_process(root=args.root, spec=spec) as here, \
            inference_stub(here.target, here.token) as (stub, md):
        info = (await stub.LoadComposition(pb_messages("inference").LoadCompositionRequest(spec=spec),
                                           metadata=md)).composition
        return await _generate(stub, md, args, messages, tools, info)


def render(names: list[str], routes: list[tuple[str, list[int]]], *, per_layer: bool) -> list[object]:
    """Rich renderables of the token-by-expert view (legend, colored text, per-layer lines, shares)."""
    color = {slot: PALETTE[slot % len(PALETTE)] for slot in range(len(names))}
    legend = Text("experts: ")
    for slot, name in enumerate(names):
        legend.append(f" {slot}:{name} ", style=f"bold black on {color[slot]}")
        legend.append(" ")
    out: list[object] = [legend]
    if not routes:
        out.append(Text("(no routing trace: the composition has no gates, or routing was not recorded)"))
        return out
    layers = len(routes[0][1])
    majority = Text("majority: ")
    for text, experts in routes:
        slot = Counter(experts).most_common(1)[0][0]
        majority.append(text, style=color[slot])
    out.append(majority)
    if per_layer:
        for layer in range(layers):
            line = Text(f"layer {layer:>2}: ")
            for text, experts in routes:
                line.append(text, style=color[experts[layer]])
            out.append(line)
    table = Table(title="share of generated tokens per expert")
    table.add_column("layer")
    for name in names:
        table.add_column(name, justify="right")
    for layer in range(layers):
        counts = Counter(experts[layer] for _, experts in routes)
        table.add_row(str(layer), *[f"{counts.get(slot, 0) / len(routes):.0%}" for slot in range(len(names))])
    out.append(table)
    return out


def cmd_route_trace(args: argparse.Namespace) -> int:
    from trace_common.errors import TraceError

    messages, tools = _conversation(args)
    target = inference_target(args)
    try:
        names, routes, finish = asyncio.run(_remote(args, target, messages, tools) if target
                                            else _local(args, messages, tools))
    except TraceError as exc:  # a flag (2), or the composition manifest could not be read here (1; damaged: 3)
        console.print(f"[red]tracectl route-trace:[/] {exc.code}: {exc}", highlight=False, soft_wrap=True)
        return exits.for_error(exc)
    except grpc.RpcError as exc:  # the service refused: its code and reason, no traceback
        console.print(f"[red]tracectl route-trace:[/] {exc.code().name}: {exc.details()}", highlight=False,
                      soft_wrap=True)
        return exits.for_status(exc.code().name)
    for item in render(names, routes, per_layer=args.per_layer):
        console.print(item)
    console.print(f"{len(routes)} tokens, finish_reason={finish}")
    return 0
