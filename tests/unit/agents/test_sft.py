"""Warm-start pieces: assistant-only loss masks, the shared-prefix batch loss (equal to the plain
one, gradients included), and a few optimizer steps that reduce the loss."""

from __future__ import annotations

import pytest
import torch

from tests.unit.policy.helpers import short_trajectories, store_trajectories, tiny_model, tiny_tokenizer
from trace_common.agents.sft import SFTConfig, batch_loss, build_examples, teacher_forced_accuracy, train
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
