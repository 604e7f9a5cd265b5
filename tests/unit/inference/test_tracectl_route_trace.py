"""`tracectl route-trace`: the rendered view (a table of cases). Its runs against the inference
service are in tests/integration/test_inference_cli.py."""

from __future__ import annotations

import pytest
from rich.console import Console

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
