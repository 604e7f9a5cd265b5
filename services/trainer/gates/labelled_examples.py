"""What the gate warm start learns from: tokenized trajectories, each labelled with one slot.

A label is a slot per trajectory, keyed by slot name (a capability's adapter, or "base" for slot
0); `outcomes.py` and `provenance.py` decide which trajectory gets which. The examples are still
called "provenance" here (`ProvenanceExample`, `provenance_examples`, the `provenance` argument
of `train_gates`): the trajectories and the slot each is labelled with, whichever kind of label
the gates job chose.

Which positions carry the label: only routing decisions that generate an assistant token. The
decision at position p computes the logits of token p+1 (the convention of the inference routing
trace: a generated token's route is that of the position that produced it), so position p is
labelled iff token p+1 lies in an assistant reply (`ChatFormat.assistant_spans`: what the policy
generated, its end-of-turn marker included). That is the last token of each assistant turn's
header through the reply's last-but-one token; no decision made while reading the system prompt,
a user message or a tool result carries a label or a loss (the gates must not learn which
environment a prompt came from from the prompt's own tokens).

The held-out split and the batch tensors live here too, so that the trainer and the routing
measurement (`routing_report.py`) read the same positions the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from trace_common.env.trajectory import Trajectory
from trace_common.errors import InvalidArgument

if TYPE_CHECKING:
    from services.trainer.gates.warm_start import GateTrainingConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProvenanceExample:
    """One tokenized trajectory and the slot its labelled positions should be routed to."""

    token_ids: list[int]
    label_mask: list[bool]  # [T] positions that carry the label (their next token is an assistant token)
    slot: int
    source: str = ""  # capability name (or "base")


def provenance_examples(tokenizer: Any, trajectories: Mapping[str, Sequence[Trajectory]],
                        expert_names: Sequence[str], config: GateTrainingConfig) -> list[ProvenanceExample]:
    """Render and tokenize each trajectory with the model's chat format; label it with its slot.

    `trajectories` maps a capability (adapter) name, or "base" for slot 0, to its trajectories. Only
    the positions whose next token is an assistant token are labelled (module docstring); a
    trajectory with no assistant reply within `max_length` tokens gives no example.

    Semantics:
        text, spans = ChatFormat.assistant_spans(messages, tools)     # char spans of the replies
        ids = tokenize(text)[:max_length];  generated[t] = token t starts inside a span
        label_mask[p] = generated[p + 1]                               # the decision that produced it
    """
    from trace_common.policy.chat import ChatFormat

    slots = {name: i for i, name in enumerate(expert_names)}
    unknown = [name for name in trajectories if name not in slots]
    if unknown:
        raise InvalidArgument(field="provenance", expected=f"capability names among {list(expert_names)}",
                              got=unknown, fix="key provenance trajectories by the adapter names of the composition")
    chat = ChatFormat(tokenizer)
    out: list[ProvenanceExample] = []
    dropped = 0
    for name, items in trajectories.items():
        for traj in items:
            ids, mask = labelled_positions(chat, tokenizer, traj, config.max_length)
            if ids and any(mask):
                out.append(ProvenanceExample(ids, mask, slots[name], name))
            else:
                dropped += 1
    if dropped:
        log.warning("%d provenance trajectories have no assistant reply within max_length=%d tokens and give no "
                    "example", dropped, config.max_length)
    if not out:
        raise InvalidArgument(field="provenance", expected=f"at least one trajectory with an assistant reply within "
                              f"max_length={config.max_length} tokens",
                              fix="raise max_length (warm_start_max_length) above the prompt's length")
    return out


def labelled_positions(chat: Any, tokenizer: Any, trajectory: Trajectory, max_length: int
                       ) -> tuple[list[int], list[bool]]:
    """(token ids [T], label mask [T]) of one trajectory (`provenance_examples`' Semantics)."""
    text, spans = chat.assistant_spans(trajectory.messages, trajectory.tools or None)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    generated = [any(s <= a < e for s, e in spans) for a, _ in enc["offset_mapping"]]  # [T_full]
    mask = [generated[p + 1] if p + 1 < len(generated) else False for p in range(len(ids))]
    return ids[:max_length], mask[:max_length]


def split_heldout(examples: Sequence[ProvenanceExample], fraction: float, seed: int
                  ) -> tuple[list[ProvenanceExample], list[ProvenanceExample]]:
    """Per slot, a seeded `fraction` of the examples (at least one when a slot has 2+) is held out."""
    train: list[ProvenanceExample] = []
    held: list[ProvenanceExample] = []
    for slot in sorted({e.slot for e in examples}):
        group = [e for e in examples if e.slot == slot]
        order = torch.randperm(len(group), generator=torch.Generator().manual_seed(seed * 1009 + slot)).tolist()
        n_held = int(round(fraction * len(group)))
        if fraction > 0 and n_held == 0 and len(group) >= 2:
            n_held = 1
        held += [group[i] for i in order[:n_held]]
        train += [group[i] for i in order[n_held:]]
    return train, held


def collate(examples: Sequence[ProvenanceExample], pad_id: int, device: torch.device
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids [B, T], attention_mask [B, T], label_mask [B, T] bool, slots [B]), right-padded."""
    width = max(len(e.token_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(examples), width), dtype=torch.long)
    labels = torch.zeros((len(examples), width), dtype=torch.bool)
    for b, e in enumerate(examples):
        n = len(e.token_ids)
        ids[b, :n] = torch.tensor(e.token_ids)
        attn[b, :n] = 1
        labels[b, :n] = torch.tensor(e.label_mask)
    slots = torch.tensor([e.slot for e in examples], dtype=torch.long)
    return ids.to(device), attn.to(device), labels.to(device), slots.to(device)


def pad_id(tokenizer: Any) -> int:
    """The id padding a batch of sequences: the tokenizer's pad token, else its end of sequence, else 0."""
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "eos_token_id", None)
    return int(pad or 0)
