"""Loading a Hugging Face causal LM from any thread of a process.

transformers builds a model in `from_pretrained` under process-wide patches that it undoes
afterwards: the default torch dtype, `PreTrainedModel.tie_weights` replaced by a no-op,
`torch.linspace` and friends re-pointed, parameters created on the meta device. Two threads
loading at once (the evaluation plays two arms at a time; each rollout job opens its policy in
a worker thread) see each other's patches: measured here, a composition loaded beside a plain
model came out with untied meta weights ("Cannot copy out of meta tensor; no data!"). So every
load of a base model in this project goes through `load_causal_lm`, which holds one lock for the
whole of `from_pretrained` (tens of milliseconds for `micro`, seconds for SmolLM2: small next to
the episodes a policy then plays).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch

#: Held for the whole of every `from_pretrained` in this process (module docstring).
LOAD_LOCK = threading.Lock()


def load_causal_lm(directory: str | Path, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                   **kwargs: Any) -> torch.nn.Module:
    """`AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, **kwargs).to(device)`, serialised."""
    from transformers import AutoModelForCausalLM

    with LOAD_LOCK:
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, **kwargs)
    return model.to(device)
