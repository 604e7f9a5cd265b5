"""How well the gates' own routing (no forcing) follows the labels: the warm start's measure.

After training, the warm start measures the gates on the labelled positions of the held-out
examples (and of the training ones): `routing_accuracy`, the share of (layer, position) decisions
equal to the label -- the number the tests hold above a threshold --, the same per label slot (the
confusion rows), and the share of decisions per routed slot, `routing_share`, which the composition
manifest stores: it picks the adapter of the `merged` export. Only the positions that carry a label
count (`labelled_examples.py`), so the measure is over exactly the decisions the gates were fitted to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from services.trainer.gates.labelled_examples import ProvenanceExample, collate
from trace_common.errors import FailedPrecondition
from trace_common.moe.composed import ComposedMoEModel


@dataclass(frozen=True)
class RoutingReport:
    """The gates' own routing on labelled positions (`routing_report`)."""

    accuracy: float  # share of labelled (layer, position) decisions routed to their label
    share: list[float]  # [K+1] share of those decisions per routed slot
    confusion: list[list[float]]  # [K+1][K+1]: row = label slot, column = routed slot (row empty: no label)
    decisions: list[int]  # [K+1] labelled decisions per label slot

    def accuracy_of(self, slot: int) -> float | None:
        """Share of slot `slot`'s labelled decisions routed to it; None when it has none."""
        row = self.confusion[slot] if slot < len(self.confusion) else []
        return row[slot] if row else None


def routing_report(model: ComposedMoEModel, examples: Sequence[ProvenanceExample], *, pad_id: int,
                   batch_size: int = 16) -> RoutingReport | None:
    """The gates' own routing (no forcing) on the labelled positions of `examples` (None: no example)."""
    if not examples:
        return None
    device = next(model.gates.parameters()).device
    if model.is_forced:
        raise FailedPrecondition("routing is forced; routing_accuracy measures the gates' own decisions")
    slots_n = model.num_slots
    confusion = torch.zeros((slots_n, slots_n), dtype=torch.float64)  # [label, routed] decision counts
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        ids, attn, labels, slots = collate(chunk, pad_id, device)
        with torch.no_grad(), model.capture_routing() as trace:
            model(input_ids=ids, attention_mask=attn, use_cache=False)
        experts = trace.experts()  # [L, B, T]
        keep = labels.unsqueeze(0).expand_as(experts)  # [L, B, T]
        target = slots.view(1, -1, 1).expand_as(experts)  # [L, B, T]
        pairs = target[keep].reshape(-1).cpu() * slots_n + experts[keep].reshape(-1).cpu()
        confusion += torch.bincount(pairs, minlength=slots_n * slots_n).double().view(slots_n, slots_n)
    total = float(confusion.sum())
    per_label = confusion.sum(dim=1)  # [K+1]
    rows = [(confusion[k] / per_label[k]).tolist() if per_label[k] > 0 else [] for k in range(slots_n)]
    share = (confusion.sum(dim=0) / total).tolist() if total > 0 else []
    return RoutingReport(accuracy=float(confusion.diagonal().sum()) / max(total, 1.0), share=share, confusion=rows,
                         decisions=[int(x) for x in per_label.tolist()])


def routing_accuracy(model: ComposedMoEModel, examples: Sequence[ProvenanceExample], *, pad_id: int,
                     batch_size: int = 16) -> tuple[float, list[float]]:
    """(share of labelled (layer, position) decisions routed to the label slot, share per slot), under
    the gates' own routing (no forcing); (nan, []) without examples."""
    report = routing_report(model, examples, pad_id=pad_id, batch_size=batch_size)
    return (float("nan"), []) if report is None else (report.accuracy, report.share)
