"""Batched sampling from a transformers causal LM, with per-request seeds and logprobs.

Why not `model.generate`: every request in a batch needs its own seeded generator (so a
reply depends on its request alone, not on its batch mates), its own temperature / top-k /
top-p / max_tokens, and the logprob of each sampled token; and rollouts of one
environment share a long prompt prefix (policy + tools) whose KV states are computed once
and reused (`PrefixCache`), which matters most on CPU. The loop is short enough to own.

Semantics (one batch of B prompts):
    m_i = longest cached prefix of prompt_i (an earlier turn of the same episode, or the
          environment's system prompt; on a cold batch the prefix all prompts share is run once)
    kv  = KV(prompt_i[:m_i]) right-aligned in [B, heads, max m, head_dim] per layer
    x   = left-padded suffixes prompt_i[m_i:]       # [B, S]
    mask = (1 on each row's m_i cached and real suffix positions, 0 on holes)  # [B, max m + S]
    pos_i = m_i + (number of real suffix tokens before each position)
    logits = model(x, mask, pos, kv)[:, -1]          # [B, V]
    repeat until every row stopped (stop token or its max_tokens):
        z = logits / T_i (T_i = 0: greedy)            # [B, V]
        logprob_i = log_softmax(z)[token_i]           # full vocabulary, before top-k / top-p
        token_i ~ softmax(truncate_{k_i, p_i}(z))     # one uniform draw from row i's generator
        feed tokens, mask += 1 column, pos += 1; finished rows leave the batch

The reported logprob is that of the sampled token under softmax(logits / temperature)
over the whole vocabulary (TRL's convention for GRPO's importance ratio); with top_k=0
and top_p=1 it is exactly the sampling distribution. Greedy rows report log_softmax(logits).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from trace_common.errors import FailedPrecondition, InvalidArgument


@dataclass
class RowParams:
    """Sampling settings of one row (see `SamplingParams`)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256
    seed: int | None = None


@dataclass
class GenerationOutput:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (a stop token was generated, and is included) or "length"


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def weights_fingerprint(model: torch.nn.Module) -> tuple[int, int]:
    """Changes whenever a parameter is modified in place (optimizer steps, merges, loads):
    the sum of the parameters' autograd version counters, and their count."""
    total = count = 0
    for p in model.parameters():
        total += p._version
        count += 1
    return total, count


KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, kv_heads, n, head_dim]


class PrefixCache:
    """KV states of recently processed token sequences (batch size 1), least recently used
    out once `max_bytes` is exceeded.

    Two kinds of entries: the prefix shared by a whole batch (an environment's system prompt)
    and, per finished row, its prompt plus completion -- the next turn of that episode
    starts with exactly those tokens, so only the new messages are run. An entry that is a
    prefix of a newer one is dropped when the newer one is stored: every prompt shares at
    least as long a prefix with the newer entry, so the older one could never be the best
    match again (without this, an episode kept one copy of its KV per turn and live episodes
    were evicted for dead turns). Entries are invalidated when the model's weights change
    (`weights_fingerprint`); call `clear()` after changes the fingerprint cannot see (e.g.
    switching PEFT adapters of an unmerged model).

    An entry may carry a per-token payload ([n, ...] tensor, row t describing token t) that
    `lookup_entry` returns cut to the matched length alongside the KV (the per-request
    adapter choice keeps its routing counts there: `trace_common.moe.export.RoutingPrefixCache`).
    """

    def __init__(self, max_bytes: int = 1 << 30, min_tokens: int = 32):
        if max_bytes < 0:
            raise InvalidArgument(field="max_bytes", expected=">= 0", got=max_bytes)
        self.max_bytes = max_bytes
        self.min_tokens = min_tokens
        self._entries: OrderedDict[tuple[int, ...], tuple[np.ndarray, KV, int, torch.Tensor | None]] = OrderedDict()
        self._bytes = 0
        self._fingerprint: tuple[int, int] | None = None
        self.hits = 0
        self.misses = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def check_weights(self, model: torch.nn.Module) -> None:
        fp = weights_fingerprint(model)
        if fp != self._fingerprint:
            self.clear()
            self._fingerprint = fp

    def lookup(self, prompt: np.ndarray) -> tuple[int, KV | None]:
        """(m, KV of the first m tokens) of the entry sharing the longest prefix with
        `prompt`; m < len(prompt) (one token is always left to run); (0, None) if no entry
        shares at least `min_tokens`."""
        m, kv, _ = self.lookup_entry(prompt)
        return m, kv

    def lookup_entry(self, prompt: np.ndarray) -> tuple[int, KV | None, torch.Tensor | None]:
        """`lookup`, plus the entry's payload cut to its first m rows (None without one)."""
        best_len, best_key = 0, None
        for key, (tokens, _, _, _) in self._entries.items():
            m = min(_lcp(tokens, prompt), len(prompt) - 1)
            if m > best_len:
                best_len, best_key = m, key
        if best_key is None or best_len < self.min_tokens:
            self.misses += 1
            return 0, None, None
        self.hits += 1
        self.reused_tokens += best_len
        self._entries.move_to_end(best_key)
        _, kv, _, payload = self._entries[best_key]
        return (best_len, [(k[:, :, :best_len], v[:, :, :best_len]) for k, v in kv],
                None if payload is None else payload[:best_len])

    def put(self, tokens: Sequence[int], kv: KV, payload: torch.Tensor | None = None) -> None:
        if self.max_bytes == 0 or len(tokens) < self.min_tokens:
            return
        if payload is not None and payload.shape[0] != len(tokens):
            raise InvalidArgument(field="payload", expected=f"one row per token ({len(tokens)})",
                                  got=list(payload.shape))
        array = np.asarray(tokens, dtype=np.int64)
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        if payload is not None:
            size += payload.numel() * payload.element_size()
        for key in [key for key, (t, _, _, _) in self._entries.items()
                    if len(t) <= len(array) and _lcp(t, array) == len(t)]:   # superseded (class docstring)
            self._bytes -= self._entries.pop(key)[2]
        self._entries[tuple(tokens)] = (array, kv, size, payload)
        self._bytes += size
        while self._bytes > self.max_bytes and self._entries:
            self._bytes -= self._entries.popitem(last=False)[1][2]


class _PreallocatedLayer(DynamicLayer):
    """A full-attention cache layer writing into buffers sized for the whole generation.

    `DynamicLayer.update` concatenates the whole cache with each new token, which made
    `torch.cat` half of the decode time for 1.5k-token contexts; writing into a buffer
    reserved up front (`reserve`) and returning views keeps each step O(new tokens).
    """

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        n = key_states.shape[-2]
        if not self.is_initialized:
            b, h, _, d = key_states.shape
            self._k = key_states.new_empty((b, h, max(self.capacity, n), d))   # [B, kv_heads, cap, d]
            self._v = value_states.new_empty((b, value_states.shape[1], max(self.capacity, n), value_states.shape[3]))
            self.device = key_states.device
            self.is_initialized = True
        if self.length + n > self._k.shape[-2]:  # more than reserved: grow geometrically
            grow = max(self.length + n, 2 * self._k.shape[-2])
            k, v = self._k, self._v
            self._k = k.new_empty((*k.shape[:2], grow, k.shape[3]))
            self._v = v.new_empty((*v.shape[:2], grow, v.shape[3]))
            self._k[..., :self.length, :] = k[..., :self.length, :]
            self._v[..., :self.length, :] = v[..., :self.length, :]
        self._k[..., self.length:self.length + n, :] = key_states
        self._v[..., self.length:self.length + n, :] = value_states
        self.length += n
        self.keys, self.values = self._k[..., :self.length, :], self._v[..., :self.length, :]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self._k, self._v = self._k[indices], self._v[indices]
            self.keys, self.values = self._k[..., :self.length, :], self._v[..., :self.length, :]


def _supports_prefix_reuse(cache: DynamicCache) -> bool:
    return all(type(layer) in (DynamicLayer, _PreallocatedLayer) for layer in cache.layers)


def _preallocated_cache(model: torch.nn.Module, capacity: int) -> DynamicCache:
    """A DynamicCache whose full-attention layers write into reserved buffers (other layer
    kinds -- sliding window, linear attention -- keep transformers' own classes)."""
    cache = _new_cache(model)
    cache.layers = [_PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer
                    for layer in cache.layers]
    return cache


def _forward(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
             position_ids: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                use_cache=True, logits_to_keep=1)
    return out.logits[:, -1, :].float()  # [B, V]


def _new_cache(model: torch.nn.Module) -> DynamicCache:
    return DynamicCache(config=model.config)


def new_kv_cache(model: torch.nn.Module, kv: KV | None = None) -> DynamicCache:
    """A transformers cache for `model`, holding `kv` (per layer [1, kv_heads, m, head_dim]) if given."""
    cache = _new_cache(model)
    for layer_idx, (k, v) in enumerate(kv or []):
        cache.update(k, v, layer_idx)
    return cache


def _prefix_kv(model: torch.nn.Module, tokens: Sequence[int], device: torch.device) -> KV:
    cache = _new_cache(model)
    ids = torch.tensor([list(tokens)], dtype=torch.long, device=device)  # [1, m]
    model(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache, use_cache=True, logits_to_keep=1)
    return [(layer.keys, layer.values) for layer in cache.layers]


def _row_kv(cache: DynamicCache, row: int, keep: torch.Tensor) -> KV:
    """The KV states of one batch row at the positions `keep` (its real tokens)."""
    return [(layer.keys[row:row + 1, :, keep].clone(), layer.values[row:row + 1, :, keep].clone())
            for layer in cache.layers]


def sample_tokens(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                  uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One sampling step for B rows with per-row settings.

    logits [B, V] float; temperature, top_p [B] float; top_k [B] long; uniforms [B] in [0, 1)
    (one draw from each row's generator). Returns (tokens [B], logprobs [B]).
    """
    greedy = temperature <= 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature)
    scaled = logits / t[:, None]                                      # [B, V]
    logp = torch.log_softmax(scaled, dim=-1)                          # [B, V]
    filtered = scaled
    vocab = logits.shape[-1]
    if bool((top_k > 0).any()):
        k = top_k.clamp(min=0, max=vocab)
        kmax = int(k.max())
        kth = torch.topk(scaled, kmax, dim=-1).values.gather(-1, (k.clamp(min=1) - 1)[:, None])  # [B, 1]
        drop = (scaled < kth) & (k > 0)[:, None]
        filtered = filtered.masked_fill(drop, float("-inf"))
    if bool((top_p < 1.0).any()):
        sorted_z, order = torch.sort(filtered, dim=-1, descending=True)  # [B, V]
        sorted_p = torch.softmax(sorted_z, dim=-1)
        mass_before = sorted_p.cumsum(-1) - sorted_p                     # [B, V]
        drop_sorted = mass_before >= top_p[:, None]                      # the top token is always kept
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        filtered = filtered.masked_fill(drop, float("-inf"))
    probs = torch.softmax(filtered, dim=-1)                            # [B, V]
    cdf = probs.cumsum(-1)                                             # [B, V]
    u = (uniforms * cdf[:, -1]).clamp(max=1.0)[:, None]                # [B, 1]
    sampled = torch.searchsorted(cdf, u).squeeze(-1).clamp(max=vocab - 1)  # [B]
    tokens = torch.where(greedy, logits.argmax(-1), sampled)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def _generator(seed: int | None, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "big") >> 1)
    return g


@torch.inference_mode()
def generate_batch(model: torch.nn.Module, prompts: Sequence[Sequence[int]], params: Sequence[RowParams], *,
                   stop_ids: Sequence[int], pad_id: int, prefix_cache: PrefixCache | None = None
                   ) -> list[GenerationOutput]:
    """Sample one completion per prompt (see the module docstring). Prompts must be non-empty."""
    if len(prompts) != len(params):
        raise InvalidArgument(field="params", expected=f"{len(prompts)} entries (one per prompt)", got=len(params))
    if not prompts:
        return []
    if any(len(p) == 0 for p in prompts):
        raise InvalidArgument(field="prompts", expected="non-empty token lists")
    device = next(model.parameters()).device
    batch = len(prompts)
    arrays = [np.asarray(p, dtype=np.int64) for p in prompts]
    use_cache = prefix_cache is not None and _supports_prefix_reuse(_new_cache(model))

    # -- reusable prefixes: per row from the cache, else one shared by the whole batch ------------
    found: list[tuple[int, KV | None]] = [(0, None)] * batch
    if use_cache:
        assert prefix_cache is not None
        prefix_cache.check_weights(model)
        found = [prefix_cache.lookup(a) for a in arrays]
        if batch > 1 and not any(kv is not None for _, kv in found):
            shared = min(min(_lcp(arrays[0], a) for a in arrays), min(len(a) for a in arrays) - 1)
            if shared >= prefix_cache.min_tokens:
                kv = _prefix_kv(model, prompts[0][:shared], device)
                prefix_cache.put(prompts[0][:shared], kv)
                found = [(shared, kv)] * batch
    lengths = [m for m, _ in found]
    width_past = max(lengths)
    width = max(len(p) - m for p, m in zip(prompts, lengths, strict=True))
    cache = _preallocated_cache(model, width_past + width + max(p.max_tokens for p in params) + 1)
    if width_past > 0:
        n_layers = len(found[lengths.index(width_past)][1])  # type: ignore[arg-type]
        for layer_idx in range(n_layers):
            k0, v0 = next(kv for _, kv in found if kv is not None)[layer_idx]
            keys = k0.new_zeros((batch, k0.shape[1], width_past, k0.shape[3]))      # [B, kv_heads, Lp, d]
            values = v0.new_zeros((batch, v0.shape[1], width_past, v0.shape[3]))
            for row, (m, kv) in enumerate(found):
                if kv is not None and m > 0:
                    keys[row, :, width_past - m:] = kv[layer_idx][0][0, :, :m]       # right-aligned
                    values[row, :, width_past - m:] = kv[layer_idx][1][0, :, :m]
            cache.update(keys, values, layer_idx)
    past_mask = torch.zeros((batch, width_past), dtype=torch.long, device=device)   # [B, Lp]
    for row, m in enumerate(lengths):
        if m:
            past_mask[row, width_past - m:] = 1

    # -- prefill the rest of each prompt (left padded) --------------------------------------------
    suffixes = [list(p[m:]) for p, m in zip(prompts, lengths, strict=True)]
    ids = torch.full((batch, width), pad_id, dtype=torch.long, device=device)      # [B, S]
    suffix_mask = torch.zeros((batch, width), dtype=torch.long, device=device)      # [B, S]
    for row, x in enumerate(suffixes):
        ids[row, width - len(x):] = torch.tensor(x, dtype=torch.long, device=device)
        suffix_mask[row, width - len(x):] = 1
    attention = torch.cat([past_mask, suffix_mask], dim=1)                           # [B, Lp+S]
    start = torch.tensor(lengths, dtype=torch.long, device=device)[:, None]          # [B, 1]
    positions = (start + suffix_mask.cumsum(-1) - 1).clamp(min=0)                    # [B, S]
    logits = _forward(model, ids, attention, positions, cache)                        # [B, V]
    next_pos = positions[:, -1] + 1                                                   # [B]

    # -- decode ---------------------------------------------------------------------------------
    stop = torch.tensor(sorted(set(stop_ids)), dtype=torch.long, device=device)
    temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)
    top_k = torch.tensor([p.top_k for p in params], dtype=torch.long, device=device)
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device)
    limits = [p.max_tokens for p in params]
    gens = [_generator(p.seed, device) for p in params]
    rows = list(range(batch))  # original index of each active row
    out_ids: list[list[int]] = [[] for _ in range(batch)]
    out_lp: list[list[float]] = [[] for _ in range(batch)]
    finish = ["length"] * batch
    while rows:
        uniforms = torch.stack([torch.rand((), generator=gens[r], device=device) for r in rows])  # [b]
        tokens, lps = sample_tokens(logits, temperature, top_k, top_p, uniforms)
        keep: list[int] = []
        tok_list, lp_list = tokens.tolist(), lps.tolist()
        is_stop = torch.isin(tokens, stop).tolist()
        for j, r in enumerate(rows):
            out_ids[r].append(tok_list[j])
            out_lp[r].append(lp_list[j])
            if is_stop[j]:
                finish[r] = "stop"
            elif len(out_ids[r]) < limits[r]:
                keep.append(j)
                continue
            if use_cache:  # remember this row's context (prompt + completion so far) for its next turn
                assert prefix_cache is not None
                fed = list(prompts[r]) + out_ids[r][:-1]  # the last sampled token was never fed
                prefix_cache.put(fed, _row_kv(cache, j, attention[j].nonzero().squeeze(-1)))
        if not keep:
            break
        if len(keep) < len(rows):
            idx = torch.tensor(keep, dtype=torch.long, device=device)
            cache.batch_select_indices(idx)
            attention, next_pos, tokens = attention[idx], next_pos[idx], tokens[idx]
            temperature, top_k, top_p = temperature[idx], top_k[idx], top_p[idx]
            rows = [rows[j] for j in keep]
        attention = torch.cat([attention, torch.ones((len(rows), 1), dtype=torch.long, device=device)], dim=1)
        logits = _forward(model, tokens[:, None], attention, next_pos[:, None], cache)
        next_pos = next_pos + 1
    return [GenerationOutput(token_ids=out_ids[i], logprobs=out_lp[i], finish_reason=finish[i])
            for i in range(batch)]


def stop_token_ids(tokenizer: Any, model: Any) -> list[int]:
    """`<|im_end|>`, the eos token and the generation config's eos ids (FailedPrecondition if none)."""
    ids: set[int] = set()
    for token in ("<|im_end|>", getattr(tokenizer, "eos_token", None)):
        if token:
            tid = tokenizer.convert_tokens_to_ids(token)
            if isinstance(tid, int) and tid != getattr(tokenizer, "unk_token_id", None):
                ids.add(tid)
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif isinstance(gen_eos, list):
        ids.update(int(i) for i in gen_eos)
    if not ids:
        raise FailedPrecondition("the tokenizer has no eos token and no <|im_end|> token: generation could not "
                                 "stop; set tokenizer.eos_token")
    return sorted(ids)
