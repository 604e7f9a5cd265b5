"""`tracectl route-trace`: the rendered view (a table of cases) and one local end-to-end run."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from tests.unit.inference.helpers import write_tiny_composition
from tests.unit.inference.tiny import TOOLS, prompt_messages
from tracectl.cli import main
from tracectl.commands.route_trace import render

NAMES = ["base", "refunds", "addresses"]


def _text(items) -> str:
    console = Console(record=True, width=200, color_system="truecolor")
    for item in items:
        console.print(item)
    return console.export_text()


@pytest.mark.parametrize("routes, per_layer, expect", [
    ([("a", [1, 1]), ("b", [2, 1])], False, ["0:base", "1:refunds", "2:addresses", "majority: ab", "100%", "50%"]),
    ([("a", [1, 1]), ("b", [2, 1])], True, ["layer  0: ab", "layer  1: ab"]),
    ([], False, ["no routing trace"]),
])
def test_render(routes, per_layer, expect):
    text = _text(render(NAMES, routes, per_layer=per_layer))
    for needle in expect:
        assert needle in text, (needle, text)


def test_render_colors_tokens_by_expert():
    console = Console(record=True, width=200, color_system="standard", force_terminal=True)
    for item in render(NAMES, [("X", [1, 1]), ("Y", [2, 2])], per_layer=False):
        console.print(item)
    styled = console.export_text(styles=True)
    assert "\x1b[32mX" in styled and "\x1b[35mY" in styled  # green = refunds, magenta = addresses


def test_route_trace_local_run(world, tmp_path, capsys):
    art = write_tiny_composition(world, tmp_path / "store")
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS["refunds"]))
    conversation = tmp_path / "conversation.json"
    conversation.write_text(json.dumps([m.to_dict() for m in prompt_messages("refunds", 1)]))
    args = ["route-trace", "--base", str(world.model_dir), "--adapter", f"refunds={world.adapter_dirs['refunds']}",
            "--adapter", f"addresses={world.adapter_dirs['addresses']}", "--gates", art.gates_uri,
            "--messages-file", str(conversation), "--tools-file", str(tools),
            "--max-tokens", "40", "--root", str(tmp_path / "root")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "addresses" in out and "share of generated tokens per expert" in out
    assert "finish_reason=tool_calls" in out and "refund_order" in out
