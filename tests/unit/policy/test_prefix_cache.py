"""PrefixCache bookkeeping: longest-prefix lookup, superseded entries, per-token payloads, byte bound."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trace_common.errors import InvalidArgument
from trace_common.policy.generation import PrefixCache

HEADS, DIM = 2, 4


def kv(tokens: list[int], layers: int = 2):
    """Fake KV whose every value is the token id at that position (so a cut is checkable)."""
    t = torch.tensor(tokens, dtype=torch.float32)[None, None, :, None].expand(1, HEADS, len(tokens), DIM)
    return [(t.clone(), t.clone()) for _ in range(layers)]


A = list(range(100, 140))                      # 40 tokens
A_LONGER = A + list(range(200, 220))           # A, then its next turn
B = A[:35] + list(range(300, 310))             # shares A's first 35 tokens, then diverges
C = list(range(500, 540))                      # nothing in common


@pytest.mark.parametrize("puts,query,expect_len,expect_entries", [
    ([A], A_LONGER, 40, 1),                    # next turn reuses the whole previous prompt
    ([A, A_LONGER], A_LONGER + [1], 60, 1),    # A is a prefix of A_LONGER: dropped when it is stored
    ([A_LONGER, A], A_LONGER + [1], 60, 2),    # a shorter put does not drop a longer entry
    ([A, B], A_LONGER, 40, 2),                 # a branch keeps both; the best match wins
    ([A, B], B + [7], 45, 2),
    ([A], A, 39, 1),                           # one token is always left to run
    ([A], C, 0, 1),                            # no shared prefix
    ([A], A[:20] + C, 0, 1),                   # shared prefix below min_tokens
    ([A, A], A_LONGER, 40, 1),                 # the same prompt twice is one entry
])
def test_lookup_and_superseding(puts, query, expect_len, expect_entries):
    cache = PrefixCache()
    for p in puts:
        cache.put(p, kv(p))
    m, got = cache.lookup(np.asarray(query))
    assert m == expect_len
    assert len(cache) == expect_entries
    if m:
        assert got is not None
        assert got[0][0].shape == (1, HEADS, m, DIM)
        assert got[0][0][0, 0, :, 0].tolist() == [float(x) for x in query[:m]]
    else:
        assert got is None


def test_payload_is_cut_to_the_match():
    cache = PrefixCache()
    payload = torch.arange(len(A_LONGER) * 3, dtype=torch.float64).view(-1, 3)      # [n, 3]
    cache.put(A_LONGER, kv(A_LONGER), payload)
    m, _, got = cache.lookup_entry(np.asarray(B))
    assert m == 35
    assert torch.equal(got, payload[:35])
    assert cache.lookup_entry(np.asarray(C))[2] is None
    with pytest.raises(InvalidArgument, match="payload"):
        cache.put(A, kv(A), payload)


def test_superseded_entries_free_their_bytes_and_the_bound_holds():
    one = sum(k.numel() * 4 * 2 for k, _ in kv(A))                 # bytes of A's KV
    cache = PrefixCache(max_bytes=3 * one)
    turns = [A + list(range(1000, 1000 + 10 * k)) for k in range(6)]   # one episode, six turns
    for t in turns:
        cache.put(t, kv(t))
    assert len(cache) == 1 and cache._bytes == sum(k.numel() * 4 * 2 for k, _ in kv(turns[-1]))
    for p in (B, C, A_LONGER):                                      # other episodes push the oldest out
        cache.put(p, kv(p))
    assert cache._bytes <= cache.max_bytes
    assert sorted(len(t) for t, *_ in cache._entries.values()) == [40, 60]   # least recently used out: turns[-1], B
    assert cache.lookup(np.asarray(turns[-1] + [1]))[0] == 40      # only A_LONGER's A part is left of it
