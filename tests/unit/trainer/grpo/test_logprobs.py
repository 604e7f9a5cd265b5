"""Assistant-token logprobs via backbone + selected positions equal the full forward's."""

from __future__ import annotations

import pytest
import torch

from services.trainer.grpo.config import GRPOConfig
from services.trainer.grpo.logprobs import selected_logprobs
from services.trainer.grpo.lora import attach_lora
from tests.unit.trainer.grpo.helpers import tiny_model


@pytest.mark.parametrize("wrap, temperature", [(False, 1.0), (True, 1.0), (True, 0.7)])
def test_selected_equals_full_forward(wrap, temperature):
    model = tiny_model(seed=3)
    if wrap:
        model = attach_lora(model, GRPOConfig(lora_r=4, seed=1))
        with torch.no_grad():  # make the adapter non-trivial
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.1)
    ids = torch.tensor([[5, 6, 7, 8, 9], [5, 11, 12, 0, 0]])
    att = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    target = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 0, 0]], dtype=torch.bool)
    with torch.no_grad():
        logp, ent = selected_logprobs(model, ids, att, target, temperature=temperature)
        logits = model(input_ids=ids, attention_mask=att).logits.float() / temperature
    full = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    sel = target[:, 1:]
    assert torch.allclose(logp, full[sel], atol=1e-5)
    p = torch.softmax(logits[:, :-1], -1)
    assert torch.allclose(ent, -(p * torch.log_softmax(logits[:, :-1], -1)).sum(-1)[sel], atol=1e-5)


@pytest.mark.parametrize("att, needs_mask", [
    ([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], False),   # right padding: the causal kernel, no mask
    ([[1, 1, 1, 1, 1], [1, 1, 1, 1, 1]], False),
    ([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], True),    # left padding keeps its mask
    ([[1, 1, 1, 1, 1], [1, 0, 1, 1, 0]], True),    # a hole keeps its mask
])
def test_mask_only_where_padding_is_not_on_the_right(monkeypatch, att, needs_mask):
    """Same logprobs and gradients as the masked full forward; SDPA gets a mask only when needed."""
    from services.trainer.grpo.logprobs import right_padded

    model = attach_lora(tiny_model(seed=5), GRPOConfig(lora_r=4, seed=1))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    ids = torch.tensor([[5, 6, 7, 8, 9], [5, 11, 12, 13, 14]])
    att = torch.tensor(att)
    target = torch.tensor([[0, 0, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)
    target[1, 2:] = att[1, 2:].bool()
    assert right_padded(att) is not needs_mask
    masks = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*a, **kw):
        masks.append(kw.get("attn_mask"))
        return sdpa(*a, **kw)
    trainable = [q for q in model.parameters() if q.requires_grad]

    def grads(logp):
        for q in trainable:
            q.grad = None
        logp.sum().backward()
        return [q.grad.clone() for q in trainable]
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    logp, _ = selected_logprobs(model, ids, att, target, with_entropy=False)
    g = grads(logp)
    assert masks and all((m is not None) is needs_mask for m in masks)
    logits = model(input_ids=ids, attention_mask=att).logits.float()    # the masked reference
    full = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)[target[:, 1:]]
    assert torch.allclose(logp, full, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(g, grads(full), strict=True))


@pytest.mark.parametrize("wrap", [False, True])
def test_shared_prefix_gives_the_same_logprobs_and_gradients(wrap):
    from services.trainer.grpo.logprobs import shared_prefix_len

    torch.manual_seed(0)
    model = tiny_model(seed=4)
    if wrap:
        model = attach_lora(model, GRPOConfig(lora_r=4, seed=1))
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.1)
    prefix = torch.randint(5, 300, (20,)).tolist()
    rows = [prefix + [7, 8, 9, 10], prefix + [11, 12, 0, 0], prefix + [13, 14, 15, 0]]
    ids = torch.tensor(rows)
    att = (torch.arange(24)[None] < torch.tensor([[24], [22], [23]])).long()
    target = torch.zeros_like(ids, dtype=torch.bool)
    target[0, 21:24] = True
    target[1, 21:22] = True
    target[2, 21:23] = True
    p = shared_prefix_len(ids, att, target)
    assert p == 20
    trainable = [q for q in model.parameters() if q.requires_grad]

    def run(prefix_len):
        for q in trainable:
            q.grad = None
        logp, _ = selected_logprobs(model, ids, att, target, prefix_len=prefix_len)
        logp.sum().backward()
        return logp.detach(), [q.grad.clone() for q in trainable]
    full, g_full = run(0)
    shared, g_shared = run(p)
    assert torch.allclose(full, shared, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(g_full, g_shared, strict=True))


@pytest.mark.parametrize("rows, targets, expected", [
    ([[1] * 20 + [2], [1] * 20 + [3]], [[20], [20]], 19),     # limited by the first target
    ([[1] * 20 + [2], [1] * 5 + [9] * 16], [[20], [20]], 0),  # below the minimum length
    ([[1] * 30], [[29]], 0),                                   # a single row shares nothing
])
def test_shared_prefix_len(rows, targets, expected):
    from services.trainer.grpo.logprobs import shared_prefix_len

    ids = torch.tensor(rows)
    t = torch.zeros_like(ids, dtype=torch.bool)
    for r, cols in enumerate(targets):
        t[r, cols] = True
    assert shared_prefix_len(ids, torch.ones_like(ids), t) == expected
