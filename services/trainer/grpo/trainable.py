"""What the GRPO loop trains: the seam between the loop and the weights it updates.

The loop (trainer.py) needs five things from the trained weights: the parameters to optimise,
their bytes for a checkpoint (and back), the model to take the KL reference from, an optional
auxiliary loss added to each micro-batch's GRPO loss, and optional per-iteration metrics.
`LoraWeights` is the capability-adapter case (a PEFT LoRA on a frozen base, the default);
`services.trainer.gates.weights.GateWeights` is the MoE case (only the per-layer gates of a
composition of frozen adapters train). Keeping the loop behind this interface is what lets gate
training reuse the rollouts, advantages, loss, checkpoints and resume of adapter training
instead of copying them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import torch

from .lora import adapter_config_bytes, adapter_state_bytes, load_adapter_state, trainable_parameters


class TrainableWeights(ABC):
    """The weights one GRPO run updates (module docstring)."""

    #: File names of the weights and their config inside a checkpoint directory.
    weights_file: str = "adapter_model.safetensors"
    config_file: str = "adapter_config.json"

    @abstractmethod
    def parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        """(name, parameter) of everything the optimiser updates; nothing else may require grad."""

    @abstractmethod
    def state_bytes(self) -> bytes:
        """The trained weights as one file's bytes (restored exactly by `load_state_bytes`)."""

    @abstractmethod
    def config_bytes(self) -> bytes:
        """A small JSON describing the weights (written next to them in a checkpoint)."""

    @abstractmethod
    def load_state_bytes(self, data: bytes) -> None:
        """Restore weights written by `state_bytes`."""

    @abstractmethod
    def reference(self) -> AbstractContextManager[None]:
        """Inside the block the model computes the KL reference policy (the frozen base)."""

    def aux_loss(self) -> torch.Tensor | None:
        """An auxiliary loss of the last forward (added to the micro-batch's GRPO loss), or None."""
        return None

    def iteration_metrics(self) -> dict[str, float]:
        """Extra values for the iteration's metrics (reported with the GRPO ones)."""
        return {}


class LoraWeights(TrainableWeights):
    """The LoRA adapter of a PEFT model (`lora.attach_lora`); the reference is the adapter disabled."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        return trainable_parameters(self.model)

    def state_bytes(self) -> bytes:
        return adapter_state_bytes(self.model)  # type: ignore[arg-type]

    def config_bytes(self) -> bytes:
        return adapter_config_bytes(self.model)  # type: ignore[arg-type]

    def load_state_bytes(self, data: bytes) -> None:
        load_adapter_state(self.model, data)  # type: ignore[arg-type]

    @contextmanager
    def reference(self) -> Iterator[None]:
        with self.model.disable_adapter():  # type: ignore[operator]
            yield
