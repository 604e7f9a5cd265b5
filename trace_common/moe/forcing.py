"""Forced routing (tests, per-request export) and routing-trace capture.

A forcing spec replaces the gates' decisions:

* an int k                      -- every token of every layer goes to slot k;
* a sequence / tensor of shape [L]       -- layer l sends every token to slot spec[l];
* a tensor of shape [L, P]      -- layer l sends the token at absolute position p to spec[l, p];
* a tensor of shape [L, B, P]   -- the same, per sequence of the batch.

Positions are the model's `position_ids` (absolute, so KV-cache decode steps look up the right
column), or 0..T-1 when the model passes none.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trace_common.errors import FailedPrecondition, InvalidArgument

ForceSpec = int | Sequence[int] | torch.Tensor


class RoutingForce:
    """A validated forcing spec that yields each layer's slot ids for the tokens it sees."""

    def __init__(self, spec: ForceSpec, num_layers: int, num_slots: int):
        self.constant: int | None = None
        self.table: torch.Tensor | None = None  # [L], [L, P] or [L, B, P] int64
        if isinstance(spec, bool):
            raise InvalidArgument(field="force", expected=f"a slot in 0..{num_slots - 1} or a tensor of slots",
                                  got=spec)
        if isinstance(spec, int):
            if not 0 <= spec < num_slots:
                raise InvalidArgument(field="force", expected=f"a slot in 0..{num_slots - 1} "
                                      "(0 = base, k = adapter k)", got=spec)
            self.constant = spec
            return
        table = torch.as_tensor(spec)
        if table.dtype.is_floating_point or table.dtype == torch.bool or table.dim() not in (1, 2, 3):
            raise InvalidArgument(field="force", expected="integer slots shaped [L], [L, P] or [L, B, P]",
                                  got=f"{table.dtype} tensor of shape {list(table.shape)}")
        if table.shape[0] != num_layers:
            raise InvalidArgument(field="force", expected=f"first dimension = number of layers ({num_layers})",
                                  got=list(table.shape))
        if table.numel() and (int(table.min()) < 0 or int(table.max()) >= num_slots):
            raise InvalidArgument(field="force", expected=f"slots in 0..{num_slots - 1}",
                                  got=f"range {int(table.min())}..{int(table.max())}")
        table = table.long()
        per_layer = table.dim() == 1
        if per_layer and bool((table == table[0]).all()):
            self.constant = int(table[0])
            return
        self.table = table

    def sole_slot(self, layer: int) -> int | None:
        """The slot of every token at `layer` when the spec does not depend on the position."""
        if self.constant is not None:
            return self.constant
        if self.table is not None and self.table.dim() == 1:
            return int(self.table[layer])
        return None

    def slots(self, layer: int, batch: int, seq: int, position_ids: torch.Tensor | None,
              device: torch.device) -> torch.Tensor:
        """Slot ids [B, T] for the tokens a layer sees."""
        sole = self.sole_slot(layer)
        if sole is not None:
            return torch.full((batch, seq), sole, dtype=torch.long, device=device)
        assert self.table is not None
        rows = self.table[layer].to(device)  # [P] or [B', P]
        if position_ids is None:
            positions = torch.arange(seq, device=device).expand(batch, seq)
        else:
            positions = position_ids.to(device).long().expand(batch, seq)  # [B, T]
        horizon = rows.shape[-1]
        if int(positions.max()) >= horizon or int(positions.min()) < 0:
            raise InvalidArgument(field="force", expected=f"a schedule covering positions 0..{int(positions.max())}",
                                  got=f"{horizon} positions",
                                  fix="extend the schedule's last dimension to the longest sequence")
        if rows.dim() == 1:
            return rows[positions]  # [B, T]
        if rows.shape[0] != batch:
            raise InvalidArgument(field="force", expected=f"batch dimension {batch}", got=rows.shape[0])
        return rows.gather(1, positions)  # [B, T]


class RoutingTrace:
    """Slot chosen per layer per token, accumulated over every forward call while capturing.

    Each forward call (a prefill, then one call per KV-cache decode step) appends its tokens,
    so after `generate` the trace covers prompt + generated tokens in order.
    """

    def __init__(self, num_layers: int):
        self._experts: list[list[torch.Tensor]] = [[] for _ in range(num_layers)]  # [B, T] chunks
        self._probs: list[list[torch.Tensor | None]] = [[] for _ in range(num_layers)]

    def record(self, layer: int, expert_ids: torch.Tensor, probs: torch.Tensor | None) -> None:
        # expert_ids: [B, T]; probs: [B, T, K+1] or None when routing was forced
        self._experts[layer].append(expert_ids.detach().clone())
        self._probs[layer].append(None if probs is None else probs.detach().clone())

    @property
    def num_calls(self) -> int:
        return len(self._experts[0]) if self._experts else 0

    def experts(self) -> torch.Tensor:
        """Slot ids [L, B, T_total] (T_total = tokens over all captured forward calls)."""
        if self.num_calls == 0:
            raise FailedPrecondition("routing trace is empty: no forward ran while capturing")
        try:
            return torch.stack([torch.cat(chunks, dim=1) for chunks in self._experts])
        except RuntimeError as exc:
            raise FailedPrecondition(f"captured forward calls have different batch sizes ({exc})") from exc

    def probs(self) -> torch.Tensor:
        """Gate probabilities [L, B, T_total, K+1]; FailedPrecondition when a call was forced."""
        if self.num_calls == 0:
            raise FailedPrecondition("routing trace is empty: no forward ran while capturing")
        if any(p is None for chunks in self._probs for p in chunks):
            raise FailedPrecondition("some captured calls were forced, so they have no gate probabilities")
        return torch.stack([torch.cat(chunks, dim=1) for chunks in self._probs])  # type: ignore[arg-type]
