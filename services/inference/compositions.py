"""Loaded compositions of the inference service: load, validate, swap; the previous one keeps serving.

Loading runs in the registry's own build thread (downloads, weight loading and validation take
seconds; one build at a time, never in the default executor that request preparation uses) and
builds a complete new `Served` entry before touching the registry. Only when every check passed
is the entry swapped in under its name. Any failure -- a reference outside the service's store and
model roots (PermissionDenied, decided before anything is read: `allowed`, trace_common/model_refs.py),
a bad URI, an adapter trained on another base, gates of the wrong shape or adapter list -- raises the
domain error and leaves the registry exactly as it was.

A load whose caller goes away (a cancelled call, a deadline) keeps the registry lock until its build
thread has finished -- a build cannot be interrupted, and a second one beside it would bypass both the
lock and `max_compositions` -- and then *discards* what it built: the caller was told the load did not
happen, so the registry stays exactly as it was, as after any other failed load.

The engine a swap replaces (or an unload removes) is retired: requests already holding it -- from the
moment the service looked it up, before tokenizing -- keep being served by it for up to `decoding.DRAIN_S`
(60 s); what is still unanswered then gets Unavailable ("... was replaced/unloaded; retry"), and the
model's hooks are removed only after the engine's worker has left its batch (decoding.CompositionEngine.close).
Retiring runs to its end even when the caller of the swap or unload goes away (the swap then still
stands: the new entry was serving before the drain began).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor
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
        #: builds run here, one at a time (module docstring), not in the default executor
        self._builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="composition-build")
        #: retirements under way (kept referenced until done; `close` waits for them)
        self._retiring: set[asyncio.Task[None]] = set()

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
            served = await self._build_to_the_end(spec)
            previous = self._served.get(spec.name)
            self._served[spec.name] = served
        if previous is not None:
            await self._retire(previous, "replaced")
        log.info("composition %s loaded: %s", spec.name, served.info())
        return served

    async def _build_to_the_end(self, spec: CompositionSpecModel) -> Served:
        """`_build(spec)` in the build thread. Cancelled, it still waits for the thread to finish (the
        caller holds the lock meanwhile), discards a finished build and re-raises the cancellation."""
        build = asyncio.wrap_future(self._builder.submit(self._build, spec))
        try:
            return await asyncio.shield(build)
        except asyncio.CancelledError:
            while not build.done():
                with contextlib.suppress(asyncio.CancelledError):   # cancelled again: still wait for the thread
                    await asyncio.wait([build])
            if not build.cancelled() and build.exception() is None:
                self._discard(build.result())
            raise

    @staticmethod
    def _discard(served: Served) -> None:
        """Drop a built entry that never served: its engine's batcher never started (no collector task, no
        worker thread: the executor starts its thread at the first batch), so only the hooks need removing."""
        if served.loaded.composed is not None:
            served.loaded.composed.remove()
        log.info("composition %s built for a load that was cancelled: discarded", served.spec.name)

    async def _retire(self, served: Served, reason: str) -> None:
        """Close `served`'s engine (drain, then refuse the rest: module docstring) and remove its hooks once
        the worker has left, shielded from the caller's cancellation so that it always completes."""
        async def retire() -> None:
            await served.engine.close(reason=reason)
            if served.loaded.composed is not None:
                served.loaded.composed.remove()

        task = asyncio.ensure_future(retire())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)
        await asyncio.shield(task)

    async def unload(self, name: str) -> None:
        async with self._lock:
            served = self.get(name)
            del self._served[name]
        await self._retire(served, "unloaded")

    async def close(self) -> None:
        for name in list(self._served):
            await self.unload(name)
        if self._retiring:
            await asyncio.wait(list(self._retiring))
        self._builder.shutdown(wait=False, cancel_futures=True)
