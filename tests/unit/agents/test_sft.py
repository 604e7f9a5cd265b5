"""Warm-start pieces: assistant-only loss masks, the shared-prefix batch loss (equal to the plain
one, gradients included), and a few optimizer steps that reduce the loss."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.policy.helpers import short_trajectories, store_trajectories, tiny_model, tiny_tokenizer
from trace_common.agents.sft import (
    SFTConfig,
    _inside_spans,
    batch_loss,
    build_examples,
    teacher_forced_accuracy,
    train,
)
from trace_common.errors import InvalidArgument
from trace_common.policy.toolcalls import render_assistant_text


def test_loss_mask_covers_exactly_the_assistant_replies():
    tok = tiny_tokenizer()
    trajs = store_trajectories()[:5]
    for traj, ex in zip(trajs, build_examples(tok, trajs), strict=True):
        masked = [t for t, m in zip(ex.input_ids, ex.loss_mask, strict=True) if m]
        expected = "".join(render_assistant_text(m) + "<|im_end|>" for m in traj.messages if m.role == "assistant")
        assert tok.decode(masked) == expected
        assert not any(ex.loss_mask[: ex.first_target])


@pytest.mark.parametrize("batch_size", [2, 4])
def test_shared_prefix_loss_and_gradients_equal_the_plain_ones(batch_size):
    tok = tiny_tokenizer()
    examples = build_examples(tok, short_trajectories(2, batch_size))
    grads = []
    losses = []
    for share in (True, False):
        model = tiny_model(seed=1)
        model.train()
        loss, n_run, n_targets = batch_loss(model, examples, tok.pad_token_id, share_prefix=share)
        loss.backward()
        losses.append(float(loss))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        assert n_targets == sum(sum(e.loss_mask) for e in examples)
        total = sum(len(e.input_ids) for e in examples)
        assert (n_run < total) if share else (n_run == total)  # the prefix ran once, not per sequence
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    assert torch.allclose(grads[0], grads[1], atol=1e-5, rtol=1e-3)


def test_a_few_steps_reduce_the_loss_and_raise_accuracy():
    tok = tiny_tokenizer()
    examples = build_examples(tok, short_trajectories(1, 8))
    model = tiny_model(seed=2)
    before = teacher_forced_accuracy(model, examples[:4], tok.pad_token_id)
    result = train(model, examples, SFTConfig(steps=8, batch_size=4, learning_rate=1e-2), tok.pad_token_id)
    after = teacher_forced_accuracy(model, examples[:4], tok.pad_token_id)
    assert result.losses[-1] < result.losses[0] * 0.7
    assert after["token_accuracy"] > before["token_accuracy"] + 0.2
    assert result.tokens_seen > 0 and result.target_tokens > 0


def test_all_sequences_too_long_is_an_invalid_argument():
    tok = tiny_tokenizer()
    examples = build_examples(tok, store_trajectories()[:2])
    with pytest.raises(InvalidArgument, match="max_seq_len"):
        train(tiny_model(), examples, SFTConfig(steps=1, max_seq_len=16), tok.pad_token_id)


@pytest.mark.parametrize(("copy_steps", "has_copy_loss"), [(0, False), (3, True)])
def test_copy_final_loss_is_the_copying_phase_only(copy_steps, has_copy_loss):
    tok = tiny_tokenizer()
    examples = build_examples(tok, short_trajectories(1, 8))
    cfg = SFTConfig(steps=2, batch_size=4, learning_rate=1e-2, copy_steps=copy_steps, copy_batch_size=4)
    result = train(tiny_model(seed=3), examples, cfg, tok.pad_token_id)
    assert len(result.losses) == copy_steps + 2
    if has_copy_loss:
        assert result.copy_final_loss == pytest.approx(sum(result.losses[:copy_steps]) / copy_steps)
    else:
        assert result.copy_final_loss is None


@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 8)), max_size=40),
       st.lists(st.tuples(st.integers(0, 60), st.integers(1, 12)), max_size=6))
def test_inside_spans_equals_the_direct_definition(tokens, raw_spans):
    """The bisection form of the assistant-token mask against its definition, on ascending token
    offsets and disjoint spans (what a fast tokenizer and `assistant_spans` give)."""
    offsets, pos = [], 0
    for gap, width in tokens:
        pos += gap % 3
        offsets.append((pos, pos + width))
        pos += width
    spans, end = [], 0
    for gap, width in raw_spans:
        start = end + gap
        spans.append((start, start + width))
        end = start + width
    direct = [e > s and any(a <= s and e <= b for a, b in spans) for s, e in offsets]
    assert _inside_spans(offsets, spans) == direct


@pytest.mark.parametrize("share_prefix", [True, False])
def test_batch_loss_equals_the_full_logits_cross_entropy(share_prefix):
    """Target-only output projection and unmasked right-padded rows give the loss of the plain
    forward: full logits with a padding mask, cross-entropy on the assistant tokens."""
    tok = tiny_tokenizer()
    examples = build_examples(tok, short_trajectories(2, 3))
    model = tiny_model(seed=4)
    loss, _, n_targets = batch_loss(model, examples, tok.pad_token_id, share_prefix=share_prefix)
    width = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), width), tok.pad_token_id)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for row, e in enumerate(examples):
        ids[row, :len(e.input_ids)] = torch.tensor(e.input_ids)
        mask[row, :len(e.input_ids)] = 1
        labels[row, :len(e.input_ids)] = torch.tensor([t if m else -100 for t, m in zip(e.input_ids, e.loss_mask,
                                                                                          strict=True)])
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]  # [B, T-1, V]
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
    assert n_targets == int((labels[:, 1:] != -100).sum())
    assert float(loss) == pytest.approx(float(ref), rel=1e-5)


@pytest.mark.parametrize(("stop_after", "expect"), [(3, 3), (5, 5), (99, 6)])
def test_stop_after_runs_the_schedules_first_steps(stop_after, expect):
    tok = tiny_tokenizer()
    examples = build_examples(tok, short_trajectories(1, 8))
    cfg = SFTConfig(steps=4, batch_size=2, learning_rate=1e-2, copy_steps=2, copy_batch_size=2)
    full = train(tiny_model(seed=5), examples, cfg, tok.pad_token_id)
    part = train(tiny_model(seed=5), examples, cfg, tok.pad_token_id, stop_after=stop_after)
    assert part.steps == expect and part.losses == full.losses[:expect]  # same data order and learning rates
