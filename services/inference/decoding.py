"""Batched generation through a loaded composition, with routing traces, streaming and cancellation.

One `CompositionEngine` per loaded composition. Concurrent requests are gathered by a
`RequestBatcher` (up to `max_batch`, waiting `batch_wait_s` for company) and decoded together on
one worker thread, so the asyncio loop stays free. A request that arrives while a batch runs
waits for the next batch (no continuous batching: the tiny CPU models served here do not need it).

Semantics of one batch of B prompts (left-padded to S tokens):
    routing forced per row to slot s_b when the composition serves `per_request`
    (s_b = choose_adapter_per_request over prompt b); under `soft_trajectory` each row's mixture
    weights w_b [L, K+1] are computed by the prefill from the gates over prompt b and applied to
    every token of row b (trace_common.moe.soft_routing); else the gates route every token
    logits = model(prompt, mask, positions)[:, -1]                   # [B, V]
    experts_prefill = slots chosen at each layer for each prompt token  # [L, B, S]
    repeat while some row is live (not stopped, not at max_tokens, not cancelled):
        token_b ~ sample(logits_b; T_b, top_k_b, top_p_b, row b's seeded generator)
        route(token_b) = experts at the position whose output sampled it    # [L]
        feed all B tokens (finished rows are fed too and ignored: shapes stay [L, B, 1])

So a generated token's routing trace is the expert per layer of the forward position that
*produced* it (the last prompt token for the first generated token); every generated token has
one, the stop token included. Routing decisions of every processed token (prompt and generated)
are counted per slot for the `tokens_routed` metric. A `soft_trajectory` composition routes no
token to one slot: its rows have no routing trace and count no routed tokens, and report their
weights instead (`RowResult.mixture`). Sampling reuses
`trace_common.policy.generation.sample_tokens` (same per-row semantics as the rollout backend).

Closing (an unload, or the swap that replaces the composition) first lets what is in flight finish:
a request counts from the moment the service takes the composition for it (`hold`, before it is
even tokenized) until its answer, and `close` waits up to `DRAIN_S` (60 s) for the count to reach zero.
Whatever is still unanswered then gets Unavailable ("... was unloaded/replaced; retry") at once,
its rows are flagged cancelled so the worker leaves the batch at its next decoding step, and
`close` returns only after the worker has left it -- so the caller may remove the model's hooks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from trace_common.errors import InvalidArgument, TraceError, Unavailable
from trace_common.moe.composition_io import LoadedComposition
from trace_common.moe.export import choose_adapter_per_request
from trace_common.policy.batcher import RequestBatcher
from trace_common.policy.generation import sample_tokens

TokenCallback = Callable[[int, list[int] | None], None]
#: Seconds a closing engine (unload, hot swap) lets the requests in flight finish before it refuses them.
DRAIN_S = 60.0


@dataclass
class RowRequest:
    """One prompt to continue (already tokenized)."""

    prompt_ids: list[int]
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256
    seed: int | None = None
    on_token: TokenCallback | None = None  # (token id, route [L] or None), from the worker thread
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass
class RowResult:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (stop token generated, included), "length" or "cancelled"
    routes: list[list[int]] | None  # [generated tokens][layers] slot ids; None without a routed model
    slot_counts: list[int]  # token-layer decisions per slot over prompt + generated tokens
    forced_slot: int | None = None  # per_request routing: the slot chosen for this request
    mixture: list[list[float]] | None = None  # soft_trajectory routing: [layers][K+1] weights of this request
    first_token_s: float = 0.0
    seconds: float = 0.0


def _cancel_row(row: RowRequest) -> None:
    """The batcher gave up on `row` (engine closed): the worker stops decoding it at its next step."""
    row.cancelled.set()


def _generator(seed: int | None, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "big") >> 1)
    return g


class CompositionEngine:
    """Generation for one loaded composition (see the module docstring)."""

    def __init__(self, loaded: LoadedComposition, *, stop_ids: Sequence[int], pad_id: int, max_batch: int = 16,
                 batch_wait_s: float = 0.005, name: str = "composition"):
        self.loaded = loaded
        self.name = name
        self.stop_ids = sorted(set(int(i) for i in stop_ids))
        self.pad_id = int(pad_id)
        self.batcher: RequestBatcher[RowRequest, RowResult | TraceError] = RequestBatcher(
            self._run_batch, max_batch=max_batch, max_wait_s=batch_wait_s, thread_name=f"gen-{name}",
            on_abandon=_cancel_row)
        config = getattr(loaded.composed.base if loaded.composed is not None else loaded.model, "config", None)
        self.config = config
        self.max_context = int(getattr(config, "max_position_embeddings", 0) or 4096)
        self.device = next(loaded.model.parameters()).device
        self.num_slots = len(loaded.expert_names) if loaded.routing != "merged" else 1
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def batch_sizes(self) -> list[int]:
        return self.batcher.batch_sizes

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Count a request in flight for the whole block, so `close` drains it (module docstring).
        Enter it on the event loop right where the composition is looked up, with no await between:
        a swap can then never close the engine between the lookup and the submit."""
        self._inflight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()

    async def submit(self, request: RowRequest) -> RowResult:
        with self.hold():
            result = (await self.batcher.submit_many([request]))[0]
        if isinstance(result, TraceError):
            raise result
        return result

    async def close(self, drain_s: float | None = None, *, reason: str = "unloaded") -> None:
        """Let in-flight requests finish (up to `drain_s`, default DRAIN_S), then answer the rest with Unavailable,
        cancel their rows and return once the worker has left its batch (module docstring).
        `reason` ("unloaded" | "replaced") is what the refused callers are told happened."""
        if self._inflight:   # nothing in flight (a discarded or idle engine): close without suspending
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), DRAIN_S if drain_s is None else drain_s)
        retry = "retry: the new version serves it" if reason == "replaced" else "retry once it is loaded again"
        await self.batcher.close(Unavailable(f"composition {self.name!r} was {reason} while this request was in "
                                             f"flight; {retry}"), wait=True)

    # ---- worker thread ------------------------------------------------------------------------
    def _run_batch(self, requests: list[RowRequest]) -> list[RowResult | TraceError]:
        live = [r for r in requests if not r.cancelled.is_set()]
        results: dict[int, RowResult | TraceError] = {}
        for r in requests:
            if r.cancelled.is_set():
                results[id(r)] = RowResult([], [], "cancelled", None, [0] * self.num_slots)
        if live:
            try:
                for r, out in zip(live, self._decode(live), strict=True):
                    results[id(r)] = out
            except (RuntimeError, ValueError, IndexError) as exc:
                err = Unavailable(f"generation failed: {type(exc).__name__}: {exc}")
                for r in live:
                    results[id(r)] = err
            except TraceError as exc:
                for r in live:
                    results[id(r)] = exc
        return [results[id(r)] for r in requests]

    @torch.inference_mode()
    def _decode(self, requests: list[RowRequest]) -> list[RowResult]:
        started = time.perf_counter()
        loaded, device = self.loaded, self.device
        composed = loaded.composed
        batch = len(requests)
        width = max(len(r.prompt_ids) for r in requests)
        if any(not r.prompt_ids for r in requests):
            raise InvalidArgument(field="messages", expected="a conversation that renders to at least one token")
        ids = torch.full((batch, width), self.pad_id, dtype=torch.long, device=device)  # [B, S]
        mask = torch.zeros((batch, width), dtype=torch.long, device=device)  # [B, S]
        for b, r in enumerate(requests):
            ids[b, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids, dtype=torch.long, device=device)
            mask[b, width - len(r.prompt_ids):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, S]
        limits = [r.max_tokens for r in requests]
        soft = composed is not None and loaded.routing == "soft_trajectory"
        routed = composed is not None and loaded.routing != "merged" and not soft
        forced_slots: list[int | None] = [None] * batch

        force_ctx = None
        if routed and loaded.routing == "per_request" and not composed.is_forced:
            choices = choose_adapter_per_request(composed, ids, mask)
            forced_slots = [c.slot for c in choices]
            horizon = width + max(limits) + 1
            table = torch.tensor(forced_slots, dtype=torch.long).view(1, batch, 1)
            force_ctx = table.expand(composed.num_layers, batch, horizon).contiguous()  # [L, B, P]

        cache = DynamicCache(config=self.config)
        counts = torch.zeros((batch, self.num_slots), dtype=torch.long)  # [B, K+1]

        def forward(x: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, live_cols: torch.Tensor):
            # x: [B, T]; live_cols: [B, T] bool, which positions are real tokens of live rows
            if soft:  # inside the soft_trajectory() block: the prefill computes the weights, decode reuses
                out = composed(input_ids=x, attention_mask=attn, position_ids=pos, cache=cache,
                               use_cache=True, logits_to_keep=1)
                return out.logits[:, -1, :].float(), None
            if not routed:
                out = loaded.model(input_ids=x, attention_mask=attn, position_ids=pos, cache=cache,
                                   use_cache=True, logits_to_keep=1)
                counts[:, 0] += live_cols.sum(-1).cpu() * (loaded.num_layers if self.num_slots > 1 else 1)
                return out.logits[:, -1, :].float(), None
            with composed.capture_routing() as trace:
                out = composed(input_ids=x, attention_mask=attn, position_ids=pos, cache=cache,
                               use_cache=True, logits_to_keep=1)
            experts = trace.experts()  # [L, B, T]
            onehot = torch.nn.functional.one_hot(experts, self.num_slots)  # [L, B, T, K+1]
            counts.add_((onehot * live_cols.unsqueeze(0).unsqueeze(-1)).sum(dim=(0, 2)).cpu())
            return out.logits[:, -1, :].float(), experts[:, :, -1].T.tolist()  # [B, V], [B][L]

        def run(x, attn, pos, live_cols):
            if force_ctx is not None:
                with composed.forced(force_ctx):
                    return forward(x, attn, pos, live_cols)
            return forward(x, attn, pos, live_cols)

        with contextlib.ExitStack() as stack:
            mixture = stack.enter_context(composed.soft_trajectory()) if soft else None
            results = self._loop(requests, run, ids, mask, positions, limits, started)
            weights = mixture.weights().tolist() if mixture is not None else None  # [L][B][K+1]
        routes_b, out_ids, out_lp, finish, first_token_s, seconds = results
        return [RowResult(token_ids=out_ids[b], logprobs=out_lp[b], finish_reason=finish[b],
                          routes=routes_b[b] if routed else None, slot_counts=counts[b].tolist(),
                          forced_slot=forced_slots[b], first_token_s=first_token_s[b], seconds=seconds,
                          mixture=[layer[b] for layer in weights] if weights is not None else None)
                for b in range(batch)]

    def _loop(self, requests: list[RowRequest], run, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
              limits: list[int], started: float):
        """Prefill then decode every row to its end (module docstring); per-row outputs."""
        device, batch = self.device, len(requests)
        logits, last_routes = run(ids, mask, positions, mask.bool())
        next_pos = positions[:, -1] + 1  # [B]
        attention = mask

        temperature = torch.tensor([r.temperature for r in requests], dtype=torch.float32, device=device)
        top_k = torch.tensor([r.top_k for r in requests], dtype=torch.long, device=device)
        top_p = torch.tensor([r.top_p for r in requests], dtype=torch.float32, device=device)
        gens = [_generator(r.seed, device) for r in requests]
        stop = set(self.stop_ids)
        out_ids: list[list[int]] = [[] for _ in range(batch)]
        out_lp: list[list[float]] = [[] for _ in range(batch)]
        routes: list[list[list[int]]] = [[] for _ in range(batch)]
        finish = ["length"] * batch
        active = [True] * batch
        first_token_s = [0.0] * batch
        while True:
            for b, r in enumerate(requests):
                if active[b] and r.cancelled.is_set():
                    active[b] = False
                    finish[b] = "cancelled"
            if not any(active):
                break
            uniforms = torch.stack([torch.rand((), generator=g, device=device) for g in gens])  # [B]
            tokens, lps = sample_tokens(logits, temperature, top_k, top_p, uniforms)  # [B], [B]
            tok_list, lp_list = tokens.tolist(), lps.tolist()
            now = time.perf_counter() - started
            for b, r in enumerate(requests):
                if not active[b]:
                    continue
                token = tok_list[b]
                out_ids[b].append(token)
                out_lp[b].append(lp_list[b])
                route = last_routes[b] if last_routes is not None else None
                if route is not None:
                    routes[b].append(route)
                if len(out_ids[b]) == 1:
                    first_token_s[b] = now
                if r.on_token is not None:
                    r.on_token(token, route)
                if token in stop:
                    finish[b] = "stop"
                    active[b] = False
                elif len(out_ids[b]) >= limits[b]:
                    active[b] = False
            if not any(active):
                break
            live_now = torch.tensor(active, dtype=torch.bool, device=device).view(batch, 1)  # [B, 1]
            attention = torch.cat([attention, torch.ones((batch, 1), dtype=torch.long, device=device)], dim=1)
            logits, last_routes = run(tokens.view(batch, 1), attention, next_pos.view(batch, 1), live_now)
            next_pos = next_pos + 1
        seconds = time.perf_counter() - started
        return routes, out_ids, out_lp, finish, first_token_s, seconds
