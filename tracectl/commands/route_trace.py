"""`tracectl route-trace`: generate once and show which expert produced each token.

    tracectl route-trace --composition file:///.../moe/composition.json --message "Refund order A17"
    tracectl route-trace --target inference=HOST:PORT --model demo --messages-file conv.json --per-layer

Without `--target` the composition is loaded in this process (same options as `tracectl serve`);
with it, a running inference service is asked (Generate with return_routing_trace). The view:
a legend (one color per expert: base + each capability adapter), the reply with each token
colored by the expert most of its layers chose, and with `--per-layer` one line per layer
colored by that layer's choice; then a table of the share of tokens per expert per layer.
A token's experts are those of the forward position that produced it (see
services/inference/decoding.py). `--messages-file` holds an OpenAI messages list (JSON);
`--tools-file` a list of tool schemas.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tracectl.commands.serve import add_composition_args, composition_spec

console = Console()
PALETTE = ("bright_black", "green", "magenta", "cyan", "yellow", "blue", "red", "bright_green", "bright_magenta",
           "bright_cyan", "bright_yellow", "bright_blue", "bright_red")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("route-trace", help="generate once; show a colored token-by-expert view")
    add_composition_args(p)
    p.add_argument("--target", default="", metavar="[inference=]HOST:PORT",
                   help="ask a running inference service instead of loading the composition here")
    p.add_argument("--token", default=None, help="bearer token for --target")
    p.add_argument("--model", default="", help="composition name on the --target service")
    p.add_argument("--message", default="", help="one user message")
    p.add_argument("--system", default="", help="optional system prompt")
    p.add_argument("--messages-file", type=Path, help="JSON list of OpenAI chat messages")
    p.add_argument("--tools-file", type=Path, help="JSON list of tool schemas")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--per-layer", action="store_true", help="one colored line per layer")
    p.add_argument("--root", type=Path, default=Path(".trace"), help="artifact store directory (local mode)")
    p.set_defaults(func=cmd_route_trace)


def _conversation(args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    if args.messages_file:
        messages = json.loads(args.messages_file.read_text())
    elif args.message:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
                   [{"role": "user", "content": args.message}]
    else:
        raise SystemExit("give --message TEXT or --messages-file conv.json")
    tools = json.loads(args.tools_file.read_text()) if args.tools_file else []
    return messages, tools


def _local(args: argparse.Namespace, messages: list[dict], tools: list[dict]):
    from services.inference.service import ChatRequest, Inference
    from services.inference.settings import InferenceSettings
    from trace_common.env.messages import Message

    async def run():
        domain = Inference(InferenceSettings(artifact_root=args.root.resolve().as_uri()))
        spec = composition_spec(args, "route-trace")
        await domain.load(spec)
        try:
            c = await domain.generate(ChatRequest(
                model=spec.name, messages=[Message.from_dict(m) for m in messages], tools=tools,
                temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed or None,
                return_routing_trace=True))
        finally:
            await domain.stop()
        return c.expert_names, [(r.token_text, r.experts) for r in c.routing], c.finish_reason
    return asyncio.run(run())


def _remote(args: argparse.Namespace, messages: list[dict], tools: list[dict]):
    from trace_common.grpc.client import Endpoint, open_channel, stub
    from trace_common.grpc.client import messages as pb_messages
    from trace_common.proto.trace.v1 import types_pb2 as t

    inf = pb_messages("inference")
    target = args.target.split("=", 1)[-1]
    with open_channel(Endpoint(target, args.token)) as channel:
        s = stub("inference", channel)
        model = args.model
        listed = {c.spec.name: c for c in s.ListCompositions(inf.ListCompositionsRequest()).compositions}
        if not model:
            if len(listed) != 1:
                raise SystemExit(f"--model is required: the service has {sorted(listed) or 'no compositions'}")
            model = next(iter(listed))
        if model not in listed:
            raise SystemExit(f"no composition {model!r} on {target}; loaded: {sorted(listed)}")
        chat = [t.ChatMessage(role=m["role"], content=m.get("content") or "", tool_call_id=m.get("tool_call_id", ""))
                for m in messages]
        resp = s.Generate(inf.GenerateRequest(
            model=model, messages=chat, tools=[t.ToolSchema(json=json.dumps(x)) for x in tools],
            sampling=t.SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed),
            return_routing_trace=True))
        names = ["base", *[a.name for a in listed[model].spec.adapters]]
        return names, [(r.token_text, list(r.experts)) for r in resp.routing_trace], resp.finish_reason


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
    try:
        names, routes, finish = (_remote if args.target else _local)(args, messages, tools)
    except TraceError as exc:
        console.print(f"[red]tracectl route-trace:[/] {exc.code}: {exc}")
        return 1
    for item in render(names, routes, per_layer=args.per_layer):
        console.print(item)
    console.print(f"{len(routes)} tokens, finish_reason={finish}")
    return 0
