"""Streamed text deltas (services.inference.service.IncrementalText) against the whole-list reference
(`reference_deltas`: the list decoded whole at every token): the same deltas token by token on the
shipped `micro` tokenizer (byte-level BPE) over real text, multi-byte characters split across tokens and
stop tokens; the same text in all over random token ids."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from services.inference.service import IncrementalText, reference_deltas

MICRO = Path(__file__).resolve().parents[3] / "trace_common" / "agents" / "shipped" / "micro"
TEXTS = [
    'I want to return order #W2378156: the "Bluetooth speaker" and 2 × cables.',
    "<tool_call>\n{\"name\": \"get_order_details\", \"arguments\": {\"order_id\": \"#W2378156\"}}\n</tool_call>",
    "naïve café — 東京 🚀 emoji and   three spaces\ttab\nnewline",
]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(MICRO)


def _streams(tok) -> list[tuple[str, list[int]]]:
    rng = random.Random(0)
    out = [(f"text {i}", tok(t, add_special_tokens=False)["input_ids"]) for i, t in enumerate(TEXTS)]
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    out.append(("with stop tokens", [*out[0][1][:5], stop, *out[0][1][5:], stop]))
    out += [(f"random {k}", [rng.randrange(len(tok)) for _ in range(200)]) for k in range(5)]
    return out


def test_deltas_equal_the_whole_list_reference(tokenizer):
    stops = {tokenizer.convert_tokens_to_ids("<|im_end|>")}
    for name, ids in _streams(tokenizer):
        inc = IncrementalText(tokenizer, stops)
        got = [inc.push(t) for t in ids]
        want = reference_deltas(tokenizer, stops, ids)
        assert "".join(got) == "".join(want), name
        if not name.startswith("random"):
            assert got == want, name


def test_a_character_split_across_tokens_is_held_back_until_whole(tokenizer):
    ids = tokenizer("🚀", add_special_tokens=False)["input_ids"]
    assert len(ids) > 1, "the emoji should take several byte-level tokens"
    inc = IncrementalText(tokenizer, set())
    deltas = [inc.push(t) for t in ids]
    assert deltas[:-1] == [""] * (len(ids) - 1) and deltas[-1] == "🚀"
