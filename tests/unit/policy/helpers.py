"""Real, tiny components built in code for policy and agent tests: a BPE tokenizer trained on a
few store-domain conversations and a random Qwen3 model (head_dim 64, two layers)."""

from __future__ import annotations

import copy
import functools

import torch

from trace_common.agents.data import WarmStartData, expert_trajectories
from trace_common.agents.tokenizer import train_tokenizer
from trace_common.env.trajectory import Trajectory
from trace_common.policy.chat import TRACE_CHATML_TEMPLATE, render_template_text


@functools.lru_cache(maxsize=1)
def store_trajectories(n: int = 24) -> tuple[Trajectory, ...]:
    return tuple(expert_trajectories(WarmStartData(episodes=n, first_seed=500, task_types="probes")))


@functools.lru_cache(maxsize=1)
def _trained_tokenizer():
    texts = [render_template_text(TRACE_CHATML_TEMPLATE, t.messages, t.tools) for t in store_trajectories()]
    return train_tokenizer(texts, vocab_size=600)


def tiny_tokenizer():
    """A fresh copy each call (tests may change its chat template)."""
    return copy.deepcopy(_trained_tokenizer())


def tiny_model(seed: int = 0, vocab_size: int | None = None):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = tiny_tokenizer()
    cfg = Qwen3Config(vocab_size=vocab_size or len(tok), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=1, num_key_value_heads=1, head_dim=64,
                      max_position_embeddings=4096, tie_word_embeddings=True, bos_token_id=None,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(cfg)
    return model.eval()


def short_trajectories(n_replies: int = 2, n: int = 8) -> list[Trajectory]:
    """Store trajectories cut after their `n_replies`-th assistant reply (short sequences for
    fast training tests)."""
    out = []
    for traj in store_trajectories()[:n]:
        idx = [k for k, m in enumerate(traj.messages) if m.role == "assistant"][:n_replies]
        out.append(traj.model_copy(update={"messages": traj.messages[: idx[-1] + 1]}))
    return out
