"""The mixture weights of soft per-trajectory routing for one batch (`SoftMixture`): what
`ComposedMoEModel.soft_trajectory()` / `mixing(weights)` compute or are given and every routed
linear then applies. `soft_routing.py` has the semantics and the generation loop.

A module of its own so that the composed model (which holds the current mixture) and the soft
routing generation loop (which drives the composed model) both depend on it and not on each other.
"""

from __future__ import annotations

import torch

from trace_common.errors import FailedPrecondition, InvalidArgument


class SoftMixture:
    """Mixture weights of soft per-trajectory routing for one batch: per layer [B, K+1] (or [1, K+1]
    for weights shared by every sequence), `None` for a layer not computed yet.

    Made by `ComposedMoEModel.soft_trajectory()` (the first forward call computes every layer's
    weights from the gates over that call's real tokens; later calls apply them) or given by
    `ComposedMoEModel.mixing(weights)`.
    """

    def __init__(self, num_layers: int, weights: torch.Tensor | None = None):
        self.num_layers = num_layers
        self.layers: list[torch.Tensor | None] = [None] * num_layers
        if weights is not None:
            w = torch.as_tensor(weights)
            if w.dim() == 2:
                w = w.unsqueeze(1)  # [L, 1, K+1]: the same weights for every sequence
            if w.dim() != 3 or w.shape[0] != num_layers or not w.dtype.is_floating_point:
                raise InvalidArgument(field="weights", expected=f"float mixture weights shaped [L={num_layers}, K+1] "
                                      "or [L, B, K+1]", got=f"{w.dtype} tensor of shape {list(w.shape)}")
            if bool((w < 0).any()) or not torch.allclose(w.sum(-1).double(), torch.ones((), dtype=torch.float64),
                                                          atol=1e-4):
                raise InvalidArgument(field="weights", expected="non-negative weights summing to 1 over the slots")
            self.layers = [w[layer] for layer in range(num_layers)]

    @property
    def complete(self) -> bool:
        return all(w is not None for w in self.layers)

    def weights(self) -> torch.Tensor:
        """All layers' weights [L, B, K+1]; FailedPrecondition before the first forward computed them."""
        if not self.complete:
            raise FailedPrecondition("no forward ran under soft routing yet: the mixture weights are unknown")
        return torch.stack(self.layers)  # type: ignore[arg-type]
