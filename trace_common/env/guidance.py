"""The `<expert_guidance>` block: how per-instance guidance is written and shown to a policy.

Why one module: three places must agree on it byte for byte. A capability environment writes
its instance's guidance (the oracle's gold actions, `gold_actions_text`); the trainer shows it
in the system prompt of the guided share of a GRPO group (`with_guidance_block`) and trains on
the plain prompt; the built-in base agents see the same block in a share of their imitation
episodes, so they learn to follow it as an instruction-tuned model would. The reference
implementation's example environment shows the literal gold tool calls in such a block.

Format (one line per action, numbered from 1; arguments as compact JSON, keys in the
oracle's order):

    <expert_guidance>
    Follow these steps for this conversation:
    1. get_order_details {"order_id": "#W0001"}
    2. cancel_pending_order {"order_id": "#W0001", "reason": "no longer needed"}
    3. tell the user: Your order #W0001 is cancelled; 45.00 will be refunded.
    </expert_guidance>

The block goes at the end of the system prompt, after one blank line; a conversation with no
system message gets one holding only the block. Guidance never appears in a target's tasks or
in evaluation: only a trainer or an imitation builder adds it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from trace_common.env.messages import Message

OPEN = "<expert_guidance>"
CLOSE = "</expert_guidance>"
HEADER = "Follow these steps for this conversation:"


def action_line(action: Mapping[str, Any]) -> str:
    """One gold action as a guidance line (without its number).

    Semantics:
        {"name": n, "arguments": a} -> f"{n} {json(a)}"
        {"message": text}           -> f"tell the user: {text}"
    """
    if "message" in action:
        return f"tell the user: {' '.join(str(action['message']).split())}"
    if "name" not in action:
        raise ValueError(f"a gold action has 'name' (a tool call) or 'message' (text for the user): {action!r}")
    return f"{action['name']} {json.dumps(action.get('arguments') or {}, separators=(', ', ': '))}"


def gold_actions_text(actions: Sequence[Mapping[str, Any]]) -> str:
    """The guidance text for `actions` (action dicts as the library oracles and `action_from_dict`
    use them): the header and one numbered line per action. Empty actions give ""."""
    if not actions:
        return ""
    return "\n".join([HEADER, *(f"{i}. {action_line(a)}" for i, a in enumerate(actions, 1))])


def guidance_block(text: str) -> str:
    """`text` inside the block's tags ("" for empty text)."""
    text = text.strip()
    return f"{OPEN}\n{text}\n{CLOSE}" if text else ""


def with_guidance_block(messages: Sequence[Message], text: str) -> list[Message]:
    """The conversation as a guided episode's policy sees it: the block appended to the first
    system message after a blank line (the block alone when that message is empty; a system
    message holding only the block is added when there is none). Empty `text` returns the
    messages unchanged."""
    block = guidance_block(text)
    out = list(messages)
    if not block:
        return out
    for i, m in enumerate(out):
        if m.role == "system":
            out[i] = m.model_copy(update={"content": f"{m.content}\n\n{block}" if m.content else block})
            return out
    return [Message.system(block), *out]


def has_guidance_block(messages: Sequence[Message]) -> bool:
    """Any message holds the block's opening tag (what tests and the loss-side checks assert absent)."""
    return any(OPEN in (m.content or "") for m in messages)
