"""Loaded compositions of the inference service: load, validate, swap; the previous one keeps serving.

Loading runs in a worker thread (downloads, weight loading and validation take seconds) and
builds a complete new `Served` entry before touching the registry. Only when every check passed
is the entry swapped in under its name; the engine it replaces is closed after the swap (its
in-flight batch finishes first: the batcher runs it to completion on its own thread). Any failure
-- a reference outside the service's store and model roots (PermissionDenied, decided before anything
is read: `allowed`, trace_common/model_refs.py), a bad URI, an adapter trained on another base, gates of
the wrong shape or adapter list -- raises the domain error and leaves the registry exactly as it was.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_common.errors import NotFound, ResourceExhausted
from trace_common.model_refs import ModelRoots
from trace_common.moe.composition_io import LoadedComposition, default_cache_dir, load_composition
from trace_common.policy.chat import ChatFormat
from trace_common.policy.generation import stop_token_ids

from .decoding import CompositionEngine
from .specs import CompositionSpecModel

log = logging.getLogger(__name__)


@dataclass
class Served:
    """A composition ready to serve: spec, model, chat format, engine."""

    spec: CompositionSpecModel
    loaded: LoadedComposition
    chat: ChatFormat
    engine: CompositionEngine

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer

    @property
    def expert_names(self) -> list[str]:
        return self.loaded.expert_names

    def info(self) -> dict[str, Any]:
        return {"name": self.spec.name, "base_model": self.spec.base_model,
                "adapters": [{"name": a.name, "uri": a.uri} for a in self.spec.adapters],
                "gates_uri": self.spec.gates_uri, "num_layers": self.loaded.num_layers,
                "hidden_size": self.loaded.hidden_size, "gate_parameters": self.loaded.gate_parameters,
                "routing": self.loaded.routing}


class CompositionRegistry:
    """Name -> `Served`, with loads that never disturb what is already serving."""

    def __init__(self, *, allowed: ModelRoots, cache_dir: str = "", device: str = "cpu", dtype: str = "float32",
                 s3=None, max_batch: int = 16, batch_wait_s: float = 0.005, max_compositions: int = 4):
        #: What a spec's base model, adapters and gates may name (the service's store and model roots).
        self.allowed = allowed
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.device, self.dtype, self.s3 = device, dtype, s3
        self.max_batch, self.batch_wait_s = max_batch, batch_wait_s
        self.max_compositions = max_compositions
        self._served: dict[str, Served] = {}
        self._lock = asyncio.Lock()

    def __contains__(self, name: str) -> bool:
        return name in self._served

    def names(self) -> list[str]:
        return sorted(self._served)

    def all(self) -> list[Served]:
        return [self._served[n] for n in self.names()]

    def get(self, name: str) -> Served:
        served = self._served.get(name)
        if served is None:
            loaded = ", ".join(self.names()) or "none"
            raise NotFound(f"no loaded composition {name!r} (loaded: {loaded}); load it with LoadComposition first")
        return served

    def _build(self, spec: CompositionSpecModel) -> Served:
        loaded = load_composition(base_model=spec.base_model, adapters=[(a.name, a.uri) for a in spec.adapters],
                                  gates_uri=spec.gates_uri, routing=spec.routing, cache_dir=self.cache_dir, s3=self.s3,
                                  dtype=self.dtype, device=self.device, allowed=self.allowed)
        tokenizer = loaded.tokenizer
        # one encode now, while nothing else uses it: transformers clears a tokenizer.json's padding and
        # truncation on the Rust tokenizer at its first call, a mutation that concurrent first requests (each
        # prepared in its own thread, service.Inference.generate) would meet as "Already borrowed"
        tokenizer("warm-up", add_special_tokens=False)
        stops = stop_token_ids(tokenizer, loaded.model if loaded.composed is None else loaded.composed.base)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
        engine = CompositionEngine(loaded, stop_ids=stops, pad_id=pad, max_batch=self.max_batch,
                                   batch_wait_s=self.batch_wait_s, name=spec.name)
        return Served(spec=spec, loaded=loaded, chat=ChatFormat(tokenizer), engine=engine)

    async def load(self, spec: CompositionSpecModel) -> Served:
        """Build `spec` (with its routing mode) and swap it in under its name (module docstring)."""
        async with self._lock:
            if spec.name not in self._served and len(self._served) >= self.max_compositions:
                raise ResourceExhausted(f"{len(self._served)} compositions are loaded (max_compositions="
                                        f"{self.max_compositions}); unload one ({', '.join(self.names())}) first")
            served = await asyncio.to_thread(self._build, spec)
            previous = self._served.get(spec.name)
            self._served[spec.name] = served
        if previous is not None:
            await previous.engine.close()
            if previous.loaded.composed is not None:
                previous.loaded.composed.remove()
        log.info("composition %s loaded: %s", spec.name, served.info())
        return served

    async def unload(self, name: str) -> None:
        async with self._lock:
            served = self.get(name)
            del self._served[name]
        await served.engine.close()

    async def close(self) -> None:
        for name in list(self._served):
            await self.unload(name)
